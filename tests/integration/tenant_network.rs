//! What a confined session's kernel reaches on the network (`--session-network`, issue 37): from
//! a real kernel of `ipybox serve --http`, hostile code tries ipybox's own port and another
//! loopback service, the cloud metadata address, a private address of this machine, a domain the
//! operator did not allow, and (with `none`) anything at all; the same code runs in a session of
//! a `--session-network host` service (the control: today's network) and reaches what it can
//! there. The common case works through the proxy: `urllib` over HTTPS to the PyPI stand-in
//! (pypi.org resolves to 203.0.113.80 here, a public address) and `pip download`.

use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener};
use std::time::Duration;

use crate::http_support::*;
use crate::mcp_eras::{Era, both_eras};
use crate::support::*;

const MARKER: &str = "loopback-service-7c1e";

/// An HTTP server on every address of this machine (0.0.0.0) that answers [`MARKER`] to any
/// request: "another service on the host's loopback", and on a private address.
fn start_marker_server() -> u16 {
    let listener = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{MARKER}",
                    MARKER.len()
                );
            });
        }
    });
    port
}

/// A private address (10/8) this test puts on the host, on a veth pair of its own (removed when
/// dropped): the host may have none, and a check that needs one must not pass without it.
struct OwnPrivateAddress {
    link: String,
    ip: IpAddr,
}

impl OwnPrivateAddress {
    /// `None` (with why) when this host does not let the test make one (not root, no veth).
    fn new() -> Result<Self, String> {
        let ip = std::net::Ipv4Addr::new(10, 251, rand::random::<u8>(), rand::random::<u8>() | 1);
        // At most 15 bytes; unique per test process.
        let link = format!("ipyt{:x}", std::process::id() & 0xff_ffff);
        let ip_cmd = |args: &[&str]| -> Result<(), String> {
            let out = std::process::Command::new("ip")
                .args(args)
                .output()
                .map_err(|e| format!("cannot run `ip`: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "`ip {}` failed: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        let peer = format!("{link}p");
        ip_cmd(&["link", "add", &link, "type", "veth", "peer", "name", &peer])?;
        let made = Self {
            link: link.clone(),
            ip: IpAddr::V4(ip),
        };
        ip_cmd(&["addr", "add", &format!("{ip}/32"), "dev", &link])?;
        ip_cmd(&["link", "set", &link, "up"])?;
        ip_cmd(&["link", "set", &peer, "up"])?;
        // The host's own address now: this machine answers on it.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpListener::bind((ip, 0)).is_err() {
            if std::time::Instant::now() > deadline {
                return Err(format!("{ip} on {link} never became usable"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(made)
    }
}

impl Drop for OwnPrivateAddress {
    fn drop(&mut self) {
        // (Removing one end of a veth pair removes both.)
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.link])
            .output();
    }
}

/// A private IPv4 address of one of this machine's interfaces (10/8, 172.16/12, 192.168/16),
/// if it has one.
fn private_address() -> Option<IpAddr> {
    let mut found = None;
    // SAFETY: getifaddrs fills a list we free with freeifaddrs; we only read it in between.
    unsafe {
        let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut list) != 0 {
            return None;
        }
        let mut cur = list;
        while !cur.is_null() {
            let addr = (*cur).ifa_addr;
            if !addr.is_null() && i32::from((*addr).sa_family) == libc::AF_INET {
                let sin = &*(addr as *const libc::sockaddr_in);
                let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                if ip.is_private() {
                    found = Some(IpAddr::V4(ip));
                    break;
                }
            }
            cur = (*cur).ifa_next;
        }
        libc::freeifaddrs(list);
    }
    found
}

/// The attack: one `name=outcome` line per attempt. `direct` connects a TCP socket; `get` is
/// `urllib.request.urlopen` (which uses the kernel's proxy variables, if any).
fn attack_code(ipybox_port: u16, service_port: u16, private: IpAddr) -> String {
    let private = format!("{:?}", private.to_string());
    format!(
        r#"import os, socket, urllib.request, urllib.error
def attempt(name, f):
    try:
        r = str(f())
    except urllib.error.HTTPError as e:
        r = f"HTTP {{e.code}} " + e.read().decode(errors="replace")
    except Exception as e:
        r = type(e).__name__ + ": " + str(e)
    print(f"{{name}}=" + r.replace("\n", " | "))
def direct(host, port):
    s = socket.create_connection((host, port), timeout=5)
    s.close()
    return "connected"
def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return f"HTTP {{r.status}} " + r.read(300).decode(errors="replace")
def get_via_proxy(url):
    # NO_PROXY names the kernel's own loopback: this asks the proxy (if any) anyway.
    proxy = os.environ.get("HTTP_PROXY")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({{"http": proxy}} if proxy else {{}}))
    saved = {{k: os.environ.pop(k) for k in ("NO_PROXY", "no_proxy") if k in os.environ}}
    try:
        with opener.open(url, timeout=10) as r:
            return f"HTTP {{r.status}} " + r.read(300).decode(errors="replace")
    finally:
        os.environ.update(saved)
attempt("ipybox_port", lambda: direct("127.0.0.1", {ipybox_port}))
attempt("loopback_service", lambda: direct("127.0.0.1", {service_port}))
attempt("loopback_via_proxy", lambda: get_via_proxy("http://127.0.0.1:{service_port}/"))
attempt("metadata", lambda: get("http://169.254.169.254/latest/meta-data/", 3))
P = {private}
attempt("private", lambda: get(f"http://{{P}}:{service_port}/"))
attempt("allowed_net", lambda: get_via_proxy("http://127.0.0.2:{service_port}/"))
attempt("pypi", lambda: get("https://pypi.org/simple/six/"))
attempt("files", lambda: get("https://files.pythonhosted.org/"))
attempt("public_direct", lambda: direct("203.0.113.80", 443))
"#
    )
}

/// The `key=value` lines of the output.
fn outcome(out: &str) -> std::collections::BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

async fn run_attack(service: &Service, code: String) -> std::collections::BTreeMap<String, String> {
    let client = connect(&service.url(), None, Era::Handshake).await;
    let (is_error, text) = cell(&client, &code, None).await;
    assert!(!is_error, "{text}\n---\n{}", service.log());
    outcome(&split_note(&text).0)
}

fn start(ws: &std::path::Path, flags: &[&str]) -> Service {
    Service::start(ws, &[], flags)
}

/// `proxy` (the default), `none`, and a domain allowlist against the `host` control, one attack.
#[tokio::test(flavor = "multi_thread")]
async fn confined_sessions_reach_only_what_the_network_policy_allows() {
    require!(TestEnv);
    let service_port = start_marker_server();
    // A private address of this machine, which the proxy must refuse and the control reaches:
    // one of the test's own (the host may have none), else the host's; with neither the test
    // cannot check the refusal, and says so (a failure under IPYBOX_TEST_STRICT).
    let own = OwnPrivateAddress::new();
    let private = match (&own, private_address()) {
        (Ok(own), _) => own.ip,
        (Err(_), Some(host)) => host,
        (Err(why), None) => {
            skip(&format!(
                "this host has no private address and the test cannot add one ({why}): run as root with `ip` (veth) to check that the proxy refuses private addresses"
            ));
            return;
        }
    };
    let ws = tempfile::tempdir().unwrap();
    let proxied = start(ws.path(), &["--session-allow-net", "127.0.0.2/32"]);
    let host = start(ws.path(), &["--session-network", "host"]);
    let domains = start(ws.path(), &["--session-allow-domain", "pypi.org"]);
    let none = start(ws.path(), &["--session-network", "none"]);
    // Kernels launched in a bubblewrap of their own (`--unshare-net`), not forked.
    let launched = start(
        ws.path(),
        &["--no-kernel-factory", "--session-allow-net", "127.0.0.2/32"],
    );
    let code = |s: &Service| attack_code(s.port, service_port, private);
    let (p, h, d, n, l) = tokio::join!(
        run_attack(&proxied, code(&proxied)),
        run_attack(&host, code(&host)),
        run_attack(&domains, code(&domains)),
        run_attack(&none, code(&none)),
        run_attack(&launched, code(&launched)),
    );
    let ctx =
        format!("proxy: {p:#?}\nhost: {h:#?}\ndomains: {d:#?}\nnone: {n:#?}\nlaunched: {l:#?}");
    let has = |m: &std::collections::BTreeMap<String, String>, k: &str, want: &str| {
        let got = m.get(k).unwrap_or_else(|| panic!("no {k}\n{ctx}"));
        assert!(got.contains(want), "{k}: want {want:?}, got {got:?}\n{ctx}");
    };

    // The control: today's network reaches ipybox's port, the loopback service, a private
    // address; the metadata address is not refused by ipybox (no such service here: a timeout).
    has(&h, "ipybox_port", "connected");
    has(&h, "loopback_service", "connected");
    has(&h, "loopback_via_proxy", MARKER);
    assert!(!h["metadata"].contains("ipybox"), "{ctx}");
    has(&h, "private", MARKER);
    has(&h, "public_direct", "connected");

    // proxy: its own loopback (nothing listens there), and the proxy refuses special addresses
    // with a message that says why and which flag allows them.
    has(&p, "ipybox_port", "ConnectionRefusedError");
    has(&p, "loopback_service", "ConnectionRefusedError");
    has(
        &p,
        "loopback_via_proxy",
        "HTTP 403 ipybox refused 127.0.0.1",
    );
    has(&p, "loopback_via_proxy", "a loopback address");
    has(&p, "loopback_via_proxy", "--session-allow-net 127.0.0.1/32");
    has(&p, "metadata", "HTTP 403");
    has(&p, "metadata", "the cloud instance metadata address");
    has(&p, "private", "HTTP 403");
    has(&p, "private", "a private address");
    // What the operator allowed is reached, through the proxy; so are public names.
    has(&p, "allowed_net", MARKER);
    has(&p, "pypi", "HTTP 200");
    assert!(!p["files"].contains("ipybox"), "{ctx}");
    // No route out but the proxy.
    has(&p, "public_direct", "OSError");

    // The same with a kernel launched in its own bubblewrap.
    has(&l, "ipybox_port", "ConnectionRefusedError");
    has(&l, "loopback_service", "ConnectionRefusedError");
    has(&l, "loopback_via_proxy", "a loopback address");
    has(&l, "metadata", "the cloud instance metadata address");
    has(&l, "allowed_net", MARKER);
    has(&l, "pypi", "HTTP 200");
    has(&l, "public_direct", "OSError");

    // A domain allowlist: pypi.org passes, files.pythonhosted.org (public, reached by the proxy
    // without a list, above) is refused with the flag that allows it (CONNECT: in the reason).
    has(&d, "pypi", "HTTP 200");
    has(&d, "files", "Tunnel connection failed: 403");
    has(&d, "files", "--session-allow-domain files.pythonhosted.org");

    // none: nothing, even through the proxy variables (set by hand: no proxy listens).
    has(&n, "ipybox_port", "ConnectionRefusedError");
    has(&n, "loopback_service", "ConnectionRefusedError");
    has(&n, "public_direct", "OSError");
    has(&n, "pypi", "URLError");
    let client = connect(&none.url(), None, Era::Stateless).await;
    let (_, text) = cell(
        &client,
        "import os, urllib.request\nos.environ['HTTPS_PROXY'] = 'http://127.0.0.1:3128'\ntry:\n    urllib.request.urlopen('https://pypi.org/simple/six/', timeout=5)\nexcept OSError as e:\n    print('none_proxy=' + type(e).__name__ + ': ' + str(e))",
        None,
    )
    .await;
    assert!(
        text.contains("none_proxy=URLError") && text.contains("Connection refused"),
        "{text}"
    );
}

/// The common case through the proxy: `pip download` from the index (PyPI's stand-in), into the
/// session's working directory; and what a proxied HTTPS request costs.
#[tokio::test(flavor = "multi_thread")]
async fn pip_download_works_through_the_proxy() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    // No warm kernel: each new session below starts (forks) its kernel.
    let service = start(ws.path(), &["--warm-sessions", "0"]);
    let host = start(
        ws.path(),
        &["--session-network", "host", "--warm-sessions", "0"],
    );
    let client = connect(&service.url(), None, Era::Stateless).await;
    let host_client = connect(&host.url(), None, Era::Stateless).await;
    // Kernel start (forked, confined) with `proxy` (a network namespace, `lo` up, the proxy and
    // the bridge) vs `host`: the first cell of a new session, median of 5 each.
    let mut starts = Vec::new();
    for c in [&client, &host_client] {
        let mut times = Vec::new();
        for _ in 0..5 {
            let t = std::time::Instant::now();
            let (is_error, text) = cell(c, "pass", None).await;
            assert!(!is_error, "{text}");
            times.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        times.sort_by(f64::total_cmp);
        starts.push(times[2]);
    }
    eprintln!(
        "new session's first cell (kernel start), median of 5: proxy {:.0} ms, host {:.0} ms",
        starts[0], starts[1]
    );
    // Without the host's PIP_* settings (a local wheel directory would answer without network).
    let code = r#"import os, subprocess, sys
env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k == "PIP_PROXY"}
r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--cert", "/etc/ssl/certs/ca-certificates.crt", "-d", "dl", "six"], env=env, capture_output=True, text=True, timeout=120)
print("rc=" + str(r.returncode))
print("files=" + ",".join(sorted(os.listdir("dl"))) if os.path.isdir("dl") else "files=")
print(r.stdout[-1500:], r.stderr[-1500:])
print("proxy=" + os.environ.get("HTTPS_PROXY", ""))
"#;
    let (is_error, text) = cell(&client, code, None).await;
    assert!(!is_error, "{text}\n{}", service.log());
    assert!(text.contains("rc=0"), "{text}");
    assert!(text.contains("files=six-"), "{text}");
    assert!(text.contains("proxy=http://127.0.0.1:3128"), "{text}");

    // The proxy's cost: HTTPS requests through it vs the same from a `host` session.
    let timing = r#"import time, urllib.request
def t(n=10):
    times = []
    for _ in range(n):
        s = time.perf_counter()
        urllib.request.urlopen("https://pypi.org/simple/six/", timeout=10).read()
        times.append(time.perf_counter() - s)
    times.sort()
    return times[len(times) // 2] * 1000
print(f"median_ms={t():.1f}")
"#;
    let (_, proxied) = cell(&client, timing, None).await;
    let (_, direct) = cell(&host_client, timing, None).await;
    eprintln!("proxied HTTPS GET: {proxied}; direct: {direct}");
    assert!(proxied.contains("median_ms="), "{proxied}");
    assert!(direct.contains("median_ms="), "{direct}");
}

/// An address of this machine's own interfaces that the proxy's address classes do not refuse
/// (a public or documentation address on a NIC: here `eth0`'s 192.0.2.2), read with
/// `getifaddrs`; when the machine has none, one made for the test on a dummy interface
/// (`ip link add`, removed when the guard drops; root only).
struct OwnAddress {
    ip: IpAddr,
    dummy: Option<String>,
}

impl Drop for OwnAddress {
    fn drop(&mut self) {
        if let Some(link) = &self.dummy {
            let _ = std::process::Command::new("ip")
                .args(["link", "del", link])
                .status();
        }
    }
}

fn own_public_address() -> Option<OwnAddress> {
    let own = ipybox::confine::network::OwnAddresses::read().ok()?;
    for (ip, interface) in own.list() {
        if ipybox::confine::network::special_kind(*ip).is_none() {
            eprintln!("this host's own address {ip} ({interface})");
            return Some(OwnAddress {
                ip: *ip,
                dummy: None,
            });
        }
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let link = format!("ipyt{}", std::process::id() % 100_000);
    let ip: IpAddr = "198.51.100.77".parse().unwrap();
    let guard = OwnAddress {
        ip,
        dummy: Some(link.clone()),
    };
    let ok = |args: &[&str]| {
        std::process::Command::new("ip")
            .args(args)
            .status()
            .is_ok_and(|s| s.success())
    };
    (ok(&["link", "add", &link, "type", "dummy"])
        && ok(&["addr", "add", "198.51.100.77/32", "dev", &link])
        && ok(&["link", "set", &link, "up"]))
    .then(|| {
        eprintln!("no public address on this host's interfaces: made {ip} on {link}");
        guard
    })
}

/// Hostile code tries a service the host binds to all addresses (`0.0.0.0`) through the proxy,
/// by the host's own non-loopback address: `CONNECT`, an absolute-URI GET through urllib, and a
/// raw HTTP/1.0 GET. Confined (`proxy`): 403 naming the host's address and the flag; the control,
/// the same service with `--session-allow-net <that address>/32` (the one flag that allows it),
/// reaches the service by each of the three.
async fn the_proxy_refuses_the_hosts_own_addresses(era: Era) {
    require!(TestEnv);
    let Some(own) = own_public_address() else {
        skip("this host has no public address on an interface and cannot make one (not root)");
        return;
    };
    let service_port = start_marker_server();
    let port = service_port.to_string();
    let net = format!("{}/32", own.ip);
    let ws = tempfile::tempdir().unwrap();
    let confined = start(ws.path(), &["--session-allow-port", &port]);
    let control = start(
        ws.path(),
        &["--session-allow-port", &port, "--session-allow-net", &net],
    );
    let code = format!(
        r#"import os, socket, urllib.request, urllib.error
H, P = {host:?}, {service_port}
def attempt(name, f):
    try:
        r = str(f())
    except urllib.error.HTTPError as e:
        r = f"HTTP {{e.code}} " + e.read().decode(errors="replace")
    except Exception as e:
        r = type(e).__name__ + ": " + str(e)
    print(f"{{name}}=" + r.replace("\n", " | ").replace("\r", ""))
def raw(request, then=None):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    if then is not None and data.startswith(b"HTTP/1.1 200"):
        s.sendall(then)
        data = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    s.close()
    return data.decode(errors="replace")[:400]
attempt("connect", lambda: raw(f"CONNECT {{H}}:{{P}} HTTP/1.1\r\nHost: {{H}}:{{P}}\r\n\r\n".encode(), b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
attempt("get", lambda: urllib.request.urlopen(f"http://{{H}}:{{P}}/", timeout=10).read().decode())
attempt("http10", lambda: raw(f"GET http://{{H}}:{{P}}/ HTTP/1.0\r\n\r\n".encode()))
"#,
        host = own.ip.to_string()
    );
    let run = |s: &Service| {
        let code = code.clone();
        let url = s.url();
        async move {
            let client = connect(&url, None, era).await;
            let (is_error, text) = cell(&client, &code, None).await;
            assert!(!is_error, "{text}");
            outcome(&split_note(&text).0)
        }
    };
    let (c, k) = tokio::join!(run(&confined), run(&control));
    let ctx = format!("confined: {c:#?}\ncontrol: {k:#?}\n{}", confined.log());
    let has = |m: &std::collections::BTreeMap<String, String>, k: &str, want: &str| {
        let got = m.get(k).unwrap_or_else(|| panic!("no {k}\n{ctx}"));
        assert!(got.contains(want), "{k}: want {want:?}, got {got:?}\n{ctx}");
    };
    for attack in ["connect", "get", "http10"] {
        // The control: the service answers by this address through the proxy.
        has(&k, attack, MARKER);
        // Confined: refused, saying why and which flag allows it.
        has(&c, attack, "403");
        has(&c, attack, "an address of this host");
        has(&c, attack, &format!("--session-allow-net {net}"));
        assert!(!c[attack].contains(MARKER), "{ctx}");
    }
    assert!(
        confined.log().contains("egress refused"),
        "{}",
        confined.log()
    );
}
both_eras!(the_proxy_refuses_the_hosts_own_addresses);

/// [`serve_refused`] that fails, rather than waits, when the service starts after all.
fn refused_within_30s(ws: &std::path::Path, flags: &[&str]) -> String {
    let err = tempfile::NamedTempFile::new().unwrap();
    let mut child = std::process::Command::new(BIN)
        .args(["serve", "--http", &format!("127.0.0.1:{}", free_port())])
        .args(flags)
        .arg("--workspace")
        .arg(ws)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(err.reopen().unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{flags:?}: the service started (not refused):\n{}",
                std::fs::read_to_string(err.path()).unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(1), "{flags:?}");
    std::fs::read_to_string(err.path()).unwrap()
}

/// Issue 51: `--session-network` (and the proxy's flags) where they cannot apply is an error at
/// start-up that says what to do, not a flag silently ignored: none or proxy with
/// `--unconfined-sessions`, any mode with `--sandbox` or `--kernel-gateway`, a proxy flag
/// without the proxy. The controls: the combinations that do apply start and serve a cell
/// (`host` with `--unconfined-sessions`, `none` confined).
#[tokio::test(flavor = "multi_thread")]
async fn session_network_is_refused_where_it_cannot_apply() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    for (flags, want) in [
        (
            &["--unconfined-sessions", "--session-network", "proxy"][..],
            "--session-network proxy cannot apply with --unconfined-sessions",
        ),
        (
            &["--unconfined-sessions", "--session-network", "none"],
            "--session-network none cannot apply with --unconfined-sessions",
        ),
        (
            &["--unconfined-sessions", "--session-allow-net", "10.0.0.0/8"],
            "--session-allow-net cannot apply with --unconfined-sessions",
        ),
        (
            &["--sandbox", "--session-network", "none"],
            "--session-network none cannot apply with --sandbox",
        ),
        (
            &["--sandbox", "--session-allow-domain", "pypi.org"],
            "--session-allow-domain cannot apply with --sandbox",
        ),
        (
            &[
                "--kernel-gateway",
                "http://127.0.0.1:9",
                "--session-network",
                "proxy",
            ],
            "--session-network proxy cannot apply to kernels on a Jupyter server",
        ),
        (
            &["--session-network", "host", "--session-allow-port", "22"],
            "--session-allow-port configures the egress proxy, and with --session-network host sessions have none",
        ),
    ] {
        let stderr = refused_within_30s(ws.path(), flags);
        assert!(stderr.contains(want), "{flags:?}: {stderr}");
        assert!(stderr.contains("help: "), "{flags:?}: {stderr}");
    }
    // The controls.
    for (flags, era) in [
        (
            &["--unconfined-sessions", "--session-network", "host"][..],
            Era::Handshake,
        ),
        (&["--session-network", "none"], Era::Stateless),
    ] {
        let service = start(ws.path(), flags);
        let client = connect(&service.url(), None, era).await;
        let (is_error, text) = cell(&client, "print('ran')", None).await;
        assert!(!is_error && text.contains("ran"), "{flags:?}: {text}");
    }
}
