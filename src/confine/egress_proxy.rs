//! The egress proxy of a session whose kernel has `--session-network proxy`: on a Unix socket in
//! the session's runtime directory (`egress.sock`, which the kernel reaches through
//! `python/ipybox_runtime/net_bridge.py` at `127.0.0.1:3128` in its own network namespace), it
//! serves HTTP `CONNECT host:port` (tunnels: HTTPS, anything over TLS) and absolute-URI plain
//! HTTP requests (`GET http://host/path`), by the session's [`NetworkPolicy`]:
//!
//! - the name is checked ([`NetworkPolicy::check_host`]), then resolved here, on the host, and
//!   every address checked ([`NetworkPolicy::check_address`], and against the host's own
//!   addresses as `getifaddrs` reads them for this connection: [`NetworkPolicy::check_own`]);
//!   the proxy connects to an address it
//!   checked (never resolving again: a name that resolves to a public address first and to
//!   127.0.0.1 next, DNS rebinding, gets nothing);
//! - a refusal answers `403` with a reason phrase and a body that say what was refused, why, and
//!   which flag allows it, and is logged (warn) with the session's tag;
//! - at most [`MAX_CONNECTIONS_PER_SESSION`] connections at once (more wait), a request head
//!   within [`HEAD_TIMEOUT`], a connection within [`CONNECT_TIMEOUT`], a tunnel closed after
//!   [`IDLE_TIMEOUT`] without a byte either way.
//!
//! A plain HTTP request goes to its destination with `Connection: close` (one request per
//! connection: a second request on a kept-alive connection would go to the same, checked,
//! address anyway).

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::network::{
    CONNECT_TIMEOUT, HEAD_TIMEOUT, IDLE_TIMEOUT, MAX_CONNECTIONS_PER_SESSION, NetworkPolicy,
    OwnAddresses, RESOLVE_TIMEOUT, Refusal, display_host,
};

/// The longest request head the proxy reads.
const MAX_HEAD: usize = 32 * 1024;

/// A running egress proxy; dropping it stops it (connections in flight end with it).
#[derive(Debug)]
pub struct EgressProxy {
    task: JoinHandle<()>,
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl EgressProxy {
    /// Listens on `path` (mode 0600) and serves `policy`; `tag` names the session in logs.
    pub fn start(path: &Path, policy: Arc<NetworkPolicy>, tag: String) -> std::io::Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS_PER_SESSION));
        let span = tracing::info_span!("egress", session = %tag);
        let task = tokio::spawn(
            async move {
                let mut connections = tokio::task::JoinSet::new();
                loop {
                    tokio::select! {
                        accepted = listener.accept() => {
                            let Ok((stream, _)) = accepted else { continue };
                            let Ok(permit) = limit.clone().acquire_owned().await else { break };
                            let policy = policy.clone();
                            connections.spawn(
                                async move {
                                    serve(stream, &policy).await;
                                    drop(permit);
                                }
                                .in_current_span(),
                            );
                        }
                        Some(_) = connections.join_next(), if !connections.is_empty() => {}
                    }
                }
            }
            .instrument(span),
        );
        Ok(Self { task })
    }
}

/// A request the proxy understood.
struct Request {
    connect: bool,
    host: String,
    port: u16,
    /// For plain HTTP: the head to send on (origin-form request line, hop-by-hop headers
    /// removed, `Connection: close`).
    head: Vec<u8>,
    /// Bytes read after the head (the start of a body, or of the tunnel).
    rest: Vec<u8>,
}

async fn serve(mut client: UnixStream, policy: &NetworkPolicy) {
    let request = match tokio::time::timeout(HEAD_TIMEOUT, read_request(&mut client)).await {
        Ok(Ok(r)) => r,
        Ok(Err(why)) => {
            let _ = answer(&mut client, 400, "Bad Request", &why).await;
            return;
        }
        Err(_) => return,
    };
    let shown = display_host(&request.host, request.port);
    let upstream = match open(&request.host, request.port, policy).await {
        Ok(s) => s,
        Err(Failure::Refused(refusal)) => {
            tracing::warn!(destination = %shown, "egress refused: {}", refusal.why);
            let _ = refuse(&mut client, &refusal).await;
            return;
        }
        Err(Failure::Unreachable(why)) => {
            tracing::info!(destination = %shown, "egress failed: {why}");
            let _ = answer(
                &mut client,
                502,
                "Bad Gateway",
                &format!("ipybox's proxy cannot reach {shown}: {why}\n"),
            )
            .await;
            return;
        }
    };
    tracing::debug!(destination = %shown, connect = request.connect, "egress");
    let mut upstream = upstream;
    if request.connect {
        if client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
    } else if upstream.write_all(&request.head).await.is_err() {
        return;
    }
    if !request.rest.is_empty() && upstream.write_all(&request.rest).await.is_err() {
        return;
    }
    pipe(client, upstream).await;
}

enum Failure {
    Refused(Refusal),
    Unreachable(String),
}

/// Checks, resolves (on the host), checks every address, connects to the first that passes.
async fn open(host: &str, port: u16, policy: &NetworkPolicy) -> Result<TcpStream, Failure> {
    policy.check_host(host, port).map_err(Failure::Refused)?;
    let literal = host.trim_matches(['[', ']']).parse::<IpAddr>().ok();
    let addresses: Vec<SocketAddr> = match literal {
        Some(ip) => vec![SocketAddr::new(ip, port)],
        None => {
            match tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((host, port))).await
            {
                Ok(Ok(found)) => found.collect(),
                Ok(Err(e)) => {
                    return Err(Failure::Unreachable(format!(
                        "cannot resolve `{host}`: {e}"
                    )));
                }
                Err(_) => {
                    return Err(Failure::Unreachable(format!(
                        "resolving `{host}` took longer than {} s",
                        RESOLVE_TIMEOUT.as_secs()
                    )));
                }
            }
        }
    };
    // The host's own addresses, read now (an interface may have gained one since the last
    // connection): a service bound to all addresses answers on each of them.
    let own = OwnAddresses::read().map_err(|e| {
        Failure::Unreachable(format!(
            "cannot read this host's addresses to check the destination against them: {e}"
        ))
    })?;
    let mut first_refusal = None;
    let mut allowed = Vec::new();
    for addr in addresses {
        match policy
            .check_address(host, addr.ip(), port)
            .and_then(|()| policy.check_own(host, addr.ip(), port, &own))
        {
            Ok(()) => allowed.push(addr),
            Err(r) => {
                first_refusal.get_or_insert(r);
            }
        }
    }
    if allowed.is_empty() {
        return Err(match first_refusal {
            Some(r) => Failure::Refused(r),
            None => Failure::Unreachable(format!("`{host}` has no address")),
        });
    }
    let mut last = String::new();
    for addr in allowed {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(e)) => last = format!("connecting to {addr}: {e}"),
            Err(_) => {
                last = format!(
                    "connecting to {addr} took longer than {} s",
                    CONNECT_TIMEOUT.as_secs()
                )
            }
        }
    }
    Err(Failure::Unreachable(last))
}

/// Reads and parses the request head.
async fn read_request(client: &mut UnixStream) -> Result<Request, String> {
    let mut buf = Vec::with_capacity(4096);
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > MAX_HEAD {
            return Err(format!(
                "the request head is longer than {} KiB\n",
                MAX_HEAD / 1024
            ));
        }
        let mut chunk = [0u8; 4096];
        let n = client
            .read(&mut chunk)
            .await
            .map_err(|e| format!("reading the request: {e}\n"))?;
        if n == 0 {
            return Err("the connection closed before a complete request head\n".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let rest = buf.split_off(end);
    let text = String::from_utf8_lossy(&buf).into_owned();
    let mut lines = text.split("\r\n");
    let first = lines.next().unwrap_or_default();
    let mut parts = first.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("not an HTTP request line: {first:?}\n"));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(format!("unsupported HTTP version {version:?}\n"));
    }
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_authority(target)
            .ok_or_else(|| format!("CONNECT needs host:port, got {target:?}\n"))?;
        return Ok(Request {
            connect: true,
            host,
            port,
            head: Vec::new(),
            rest,
        });
    }
    let not_proxy = || {
        format!(
            "ipybox's egress proxy takes CONNECT host:port or an absolute http:// URI, got {target:?} (https:// goes through CONNECT)\n"
        )
    };
    if !target
        .get(..7)
        .is_some_and(|s| s.eq_ignore_ascii_case("http://"))
    {
        return Err(not_proxy());
    }
    let url = url::Url::parse(target).map_err(|_| not_proxy())?;
    let host = match url.host() {
        Some(url::Host::Domain(d)) => d.to_string(),
        Some(url::Host::Ipv4(ip)) => ip.to_string(),
        Some(url::Host::Ipv6(ip)) => ip.to_string(),
        None => return Err(not_proxy()),
    };
    let port = url.port_or_known_default().unwrap_or(80);
    let mut path = url.path().to_string();
    if let Some(q) = url.query() {
        path.push('?');
        path.push_str(q);
    }
    let mut head = format!("{method} {path} {version}\r\n");
    for line in lines.filter(|l| !l.is_empty()) {
        let name = line.split(':').next().unwrap_or_default().trim();
        if [
            "proxy-connection",
            "proxy-authorization",
            "connection",
            "keep-alive",
        ]
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h))
        {
            continue;
        }
        head.push_str(line);
        head.push_str("\r\n");
    }
    head.push_str("Connection: close\r\n\r\n");
    Ok(Request {
        connect: false,
        host,
        port,
        head: head.into_bytes(),
        rest,
    })
}

/// `host:port` or `[v6]:port`.
fn split_authority(target: &str) -> Option<(String, u16)> {
    let (host, port) = target.rsplit_once(':')?;
    let port = port.parse().ok()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return None;
    }
    Some((host.to_string(), port))
}

async fn refuse(client: &mut UnixStream, refusal: &Refusal) -> std::io::Result<()> {
    // The reason phrase says it too: urllib, requests and pip show only the status line of a
    // refused CONNECT.
    let reason: String = format!("Forbidden by ipybox: {} ({})", refusal.why, refusal.help)
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                ' '
            }
        })
        .collect();
    answer(client, 403, &reason, &format!("{refusal}\n")).await
}

async fn answer(
    client: &mut UnixStream,
    code: u16,
    reason: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    client.write_all(head.as_bytes()).await?;
    client.write_all(body.as_bytes()).await?;
    client.shutdown().await
}

/// Copies both ways until both sides are done, or nothing moved for [`IDLE_TIMEOUT`].
async fn pipe(client: UnixStream, upstream: TcpStream) {
    let (mut cr, mut cw) = client.into_split();
    let (mut ur, mut uw) = upstream.into_split();
    let mut cbuf = vec![0u8; 16 * 1024];
    let mut ubuf = vec![0u8; 16 * 1024];
    let (mut c_open, mut u_open) = (true, true);
    while c_open || u_open {
        tokio::select! {
            r = cr.read(&mut cbuf), if c_open => match r {
                Ok(0) | Err(_) => {
                    c_open = false;
                    let _ = uw.shutdown().await;
                }
                Ok(n) => {
                    if uw.write_all(&cbuf[..n]).await.is_err() {
                        return;
                    }
                }
            },
            r = ur.read(&mut ubuf), if u_open => match r {
                Ok(0) | Err(_) => {
                    u_open = false;
                    let _ = cw.shutdown().await;
                }
                Ok(n) => {
                    if cw.write_all(&ubuf[..n]).await.is_err() {
                        return;
                    }
                }
            },
            _ = tokio::time::sleep(IDLE_TIMEOUT) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_split() {
        assert_eq!(
            split_authority("pypi.org:443"),
            Some(("pypi.org".into(), 443))
        );
        assert_eq!(split_authority("[::1]:80"), Some(("::1".into(), 80)));
        assert_eq!(split_authority("pypi.org"), None);
        assert_eq!(split_authority(":80"), None);
        assert_eq!(split_authority("a:99999"), None);
    }
}
