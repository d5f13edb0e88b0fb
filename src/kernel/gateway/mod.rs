//! Kernels on a Jupyter server: Jupyter Kernel Gateway, Jupyter Enterprise Gateway or Jupyter
//! Server, which all serve the same kernels API.
//!
//! - this module: the server's address and token, and its REST calls (create, interrupt, delete);
//! - `connection`: one kernel's WebSocket (`/api/kernels/{id}/channels`), reconnects, death,
//!   and the stdin channel that carries tool calls;
//! - `framing`: the two WebSocket framings (v1 subprotocol, legacy JSON);
//! - `bootstrap`: the first cell a new kernel runs (ipybox's kernel-side runtime, sent over the
//!   connection: the server's kernel image needs only ipykernel and pydantic);
//! - `ledger`: kernels ipybox created and has not deleted yet, cleaned up on the next start.
//!
//! The token is sent as `Authorization: token …`, never logged and never written anywhere.

pub(crate) mod bootstrap;
pub(crate) mod connection;
pub(crate) mod framing;
pub(crate) mod ledger;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use reqwest::{Method, StatusCode, Url};
use serde_json::{Value, json};

use super::KernelError;
use crate::host_env::HostEnv;

/// The variable the gateway's token is read from when the URL carries none.
pub(crate) const TOKEN_VAR: &str = "IPYBOX_GATEWAY_TOKEN";

/// How long [`Gateway::delete`] keeps asking a server that answers a delete with an error.
const DELETE_RETRY_FOR: Duration = Duration::from_secs(10);

/// A Jupyter server that runs ipybox's kernels.
#[derive(Clone)]
pub(crate) struct Gateway {
    http: reqwest::Client,
    /// Scheme, host, port and base path (ending in `/`); no query, no credentials.
    base: Url,
    token: Option<String>,
    /// The kernelspec kernels are created with.
    pub(crate) kernel_name: String,
    /// Offer the v1 subprotocol (`?framing=legacy` turns it off, for proxies that drop it).
    offer_v1: bool,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("url", &self.base.as_str())
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("kernel_name", &self.kernel_name)
            .field("offer_v1", &self.offer_v1)
            .finish()
    }
}

impl Gateway {
    /// The server's base URL (scheme, host, port, base path; no credentials, no query).
    pub(crate) fn base(&self) -> &str {
        self.base.as_str()
    }

    /// Parses `--kernel-gateway` / `kernel_gateway(url)`:
    /// `http[s]://host:port[/base][?token=…&kernel=…&framing=legacy]`.
    /// `${VAR}` placeholders are taken from `host`; without a `token` parameter the token is
    /// `IPYBOX_GATEWAY_TOKEN` (if set).
    pub(crate) fn parse(spec: &str, host: &HostEnv) -> Result<Self, KernelError> {
        let bad = |reason: String| KernelError::Start {
            reason,
            help: "pass --kernel-gateway http://HOST:PORT (optionally ?token=${VAR}&kernel=NAME)"
                .into(),
        };
        let vars: HashMap<String, String> = host.vars().clone();
        let mut secrets = Vec::new();
        let expanded = crate::tools::env_subst::substitute_str(
            spec.trim(),
            &vars,
            "kernel gateway URL",
            &mut secrets,
        )
        .map_err(|e| bad(e.to_string()))?;
        let mut url = Url::parse(&expanded).map_err(|e| {
            bad(format!(
                "invalid kernel gateway URL `{}`: {e}",
                redact_query(spec.trim())
            ))
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(bad(format!(
                "the kernel gateway URL must start with http:// or https://, not `{}://`",
                url.scheme()
            )));
        }
        let mut token = None;
        let mut kernel_name = "python3".to_string();
        let mut offer_v1 = true;
        for (k, v) in url.query_pairs() {
            match (k.as_ref(), v.as_ref()) {
                ("token", t) if !t.is_empty() => token = Some(t.to_string()),
                ("kernel" | "kernel_name", name) if !name.is_empty() => {
                    kernel_name = name.to_string()
                }
                ("framing", "legacy") => offer_v1 = false,
                ("framing", "v1") => offer_v1 = true,
                (other, _) => {
                    return Err(bad(format!(
                        "unknown kernel gateway URL parameter `{other}` (known: token, kernel, framing=v1|legacy)"
                    )));
                }
            }
        }
        if token.is_none() {
            token = host
                .get(TOKEN_VAR)
                .filter(|t| !t.is_empty())
                .map(str::to_string);
        }
        url.set_query(None);
        url.set_fragment(None);
        let _ = url.set_username("");
        let _ = url.set_password(None);
        if !url.path().ends_with('/') {
            let path = format!("{}/", url.path());
            url.set_path(&path);
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| bad(format!("cannot build an HTTP client: {e}")))?;
        Ok(Self {
            http,
            base: url,
            token,
            kernel_name,
            offer_v1,
        })
    }

    /// The server's address, safe to show (no token).
    pub(crate) fn url(&self) -> &str {
        self.base.as_str()
    }

    fn endpoint(&self, path: &str) -> Url {
        // `path` is relative ("api/kernels/…"); the base ends with '/'.
        self.base.join(path).unwrap_or_else(|_| self.base.clone())
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(StatusCode, Value), KernelError> {
        let mut req = self.http.request(method.clone(), self.endpoint(path));
        if let Some(token) = &self.token {
            req = req.header("Authorization", format!("token {token}"));
        }
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.map_err(|e| self.unreachable(&e))?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(self.refused(status, &text));
        }
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, value))
    }

    fn unreachable(&self, e: &reqwest::Error) -> KernelError {
        let mut cause = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            cause = format!("{cause}: {s}");
            source = s.source();
        }
        KernelError::Start {
            reason: format!("cannot reach the kernel gateway at {}: {cause}", self.url()),
            help: "check that the Jupyter server runs and that --kernel-gateway names it".into(),
        }
    }

    fn refused(&self, status: StatusCode, body: &str) -> KernelError {
        let detail = detail(body);
        KernelError::Start {
            reason: format!(
                "the kernel gateway at {} refused ipybox's credentials (HTTP {}){}",
                self.url(),
                status.as_u16(),
                if detail.is_empty() {
                    String::new()
                } else {
                    format!(": {detail}")
                }
            ),
            help: format!(
                "{} (set {TOKEN_VAR}, or ?token=${{VAR}} in the URL, to the server's token)",
                if self.token.is_some() {
                    "the token is wrong"
                } else {
                    "the server needs a token"
                }
            ),
        }
    }

    /// `POST /api/kernels`: starts a kernel; returns its id. `env` goes into the request (the
    /// servers pass `KERNEL_*` variables, and those they allow, to the kernel).
    pub(crate) async fn create_kernel(
        &self,
        env: &BTreeMap<String, String>,
    ) -> Result<String, KernelError> {
        let body = json!({"name": self.kernel_name, "env": env});
        let (status, value) = self.call(Method::POST, "api/kernels", Some(body)).await?;
        match value.get("id").and_then(Value::as_str) {
            Some(id) if status.is_success() => Ok(id.to_string()),
            _ => Err(KernelError::Start {
                reason: format!(
                    "the kernel gateway at {} could not start a `{}` kernel (HTTP {}): {}",
                    self.url(),
                    self.kernel_name,
                    status.as_u16(),
                    detail(&value.to_string())
                ),
                help: "check the server's log and its kernelspecs (?kernel=NAME picks another)"
                    .into(),
            }),
        }
    }

    /// `POST /api/kernels/{id}/interrupt`.
    pub(crate) async fn interrupt(&self, id: &str) -> Result<(), KernelError> {
        let (status, value) = self
            .call(Method::POST, &format!("api/kernels/{id}/interrupt"), None)
            .await?;
        if status.is_success() {
            Ok(())
        } else {
            Err(failed(&format!("interrupting kernel {id}"), status, &value))
        }
    }

    /// `DELETE /api/kernels/{id}`; a kernel the server no longer has counts as deleted.
    ///
    /// A server error is asked again, with backoff, for up to [`DELETE_RETRY_FOR`]: Jupyter
    /// Server answers 500 to a delete that arrives while it restarts the kernel (its restarter
    /// acts on a kernel that died), and accepts the same delete once the restart is done.
    pub(crate) async fn delete(&self, id: &str) -> Result<(), KernelError> {
        let deadline = tokio::time::Instant::now() + DELETE_RETRY_FOR;
        let mut pause = Duration::from_millis(50);
        loop {
            let (status, value) = self
                .call(Method::DELETE, &format!("api/kernels/{id}"), None)
                .await?;
            if status.is_success() || status == StatusCode::NOT_FOUND {
                return Ok(());
            }
            if !status.is_server_error() || tokio::time::Instant::now() + pause > deadline {
                return Err(failed(&format!("deleting kernel {id}"), status, &value));
            }
            tracing::debug!(kernel = %id, %status, "the server failed a delete; asking again");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// Whether the server still has kernel `id` (`GET /api/kernels/{id}`): only a 404 says it
    /// has not; another failure (a busy server's 5xx) is an error, to be asked again.
    pub(crate) async fn has_kernel(&self, id: &str) -> Result<bool, KernelError> {
        let (status, value) = self
            .call(Method::GET, &format!("api/kernels/{id}"), None)
            .await?;
        match status {
            s if s.is_success() => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            s => Err(failed(&format!("asking for kernel {id}"), s, &value)),
        }
    }

    /// What the server says about kernel `id` (`GET /api/kernels/{id}`): `None` if it has no
    /// such kernel. Used by replicas that share a server's kernels: how many WebSockets are
    /// open to it, and how long ago it was last active.
    pub(crate) async fn kernel_status(
        &self,
        id: &str,
    ) -> Result<Option<KernelStatus>, KernelError> {
        let (status, value) = self
            .call(Method::GET, &format!("api/kernels/{id}"), None)
            .await?;
        match status {
            s if s.is_success() => Ok(Some(KernelStatus {
                connections: value.get("connections").and_then(Value::as_u64),
                last_activity: value
                    .get("last_activity")
                    .and_then(Value::as_str)
                    .and_then(parse_utc_timestamp),
            })),
            StatusCode::NOT_FOUND => Ok(None),
            s => Err(failed(&format!("asking for kernel {id}"), s, &value)),
        }
    }

    /// The WebSocket request for kernel `id`, offering the v1 subprotocol (unless turned off).
    pub(crate) fn channels_request(
        &self,
        id: &str,
        session: &str,
    ) -> Result<tokio_tungstenite::tungstenite::handshake::client::Request, KernelError> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut url = self.endpoint(&format!("api/kernels/{id}/channels"));
        let scheme = if url.scheme() == "https" { "wss" } else { "ws" };
        let _ = url.set_scheme(scheme);
        url.set_query(Some(&format!("session_id={session}")));
        let mut req = url.as_str().into_client_request().map_err(super::proto)?;
        let headers = req.headers_mut();
        if self.offer_v1 {
            headers.insert(
                "Sec-WebSocket-Protocol",
                framing::V1_PROTOCOL.parse().map_err(super::proto)?,
            );
        }
        if let Some(token) = &self.token {
            headers.insert(
                "Authorization",
                format!("token {token}").parse().map_err(super::proto)?,
            );
        }
        Ok(req)
    }
}

/// A kernel as a Jupyter server describes it (the parts replicas need).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelStatus {
    /// Open WebSocket connections to the kernel (`None`: the server does not say).
    pub connections: Option<u64>,
    /// When the kernel was last active (any message), as seconds since the Unix epoch.
    pub last_activity: Option<u64>,
}

/// Seconds since the Unix epoch of an ISO 8601 UTC timestamp as Jupyter servers write them
/// (`2026-05-01T12:00:00.123456Z`, or `+00:00`); `None` for anything else.
pub(crate) fn parse_utc_timestamp(text: &str) -> Option<u64> {
    let text = text.trim();
    let (date, time) = text.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let time = time
        .strip_suffix('Z')
        .or_else(|| time.strip_suffix("+00:00"))?;
    let time = time.split('.').next()?;
    let mut t = time.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + hh * 3600 + mm * 60 + ss).ok()
}

/// A failed REST call as a protocol error: what was attempted, the status and the server's words.
fn failed(what: &str, status: StatusCode, body: &Value) -> KernelError {
    super::proto(format!(
        "{what} failed (HTTP {}): {}",
        status.as_u16(),
        detail(&body.to_string())
    ))
}

/// A server's error body, shortened: Jupyter servers answer `{"message": …, "reason": …}`.
fn detail(body: &str) -> String {
    let text = match serde_json::from_str::<Value>(body) {
        Ok(v) => v
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| body.to_string()),
        Err(_) => body.to_string(),
    };
    crate::tools::shorten(text.trim(), 300)
}

/// `spec` with its query (which may hold a token) cut off, for messages.
pub(crate) fn redact_query(spec: &str) -> String {
    match spec.split_once('?') {
        Some((base, _)) => format!("{base}?…"),
        None => spec.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(vars: &[(&str, &str)]) -> HostEnv {
        HostEnv::from_vars(
            vars.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn parses_token_kernel_and_base_path() {
        let gw = Gateway::parse(
            "http://gw.example:8888/jupyter?token=${GW}&kernel=py311",
            &host(&[("GW", "s3cret")]),
        )
        .unwrap();
        assert_eq!(gw.url(), "http://gw.example:8888/jupyter/");
        assert_eq!(gw.token.as_deref(), Some("s3cret"));
        assert_eq!(gw.kernel_name, "py311");
        assert_eq!(
            gw.endpoint("api/kernels").as_str(),
            "http://gw.example:8888/jupyter/api/kernels"
        );
        assert!(!format!("{gw:?}").contains("s3cret"));
        let req = gw.channels_request("abc", "sess").unwrap();
        assert_eq!(
            req.uri().to_string(),
            "ws://gw.example:8888/jupyter/api/kernels/abc/channels?session_id=sess"
        );
        assert_eq!(req.headers()["Authorization"], "token s3cret");
    }

    #[test]
    fn jupyter_timestamps() {
        assert_eq!(parse_utc_timestamp("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_utc_timestamp("2026-05-01T12:30:15.123456Z"),
            Some(1_777_638_615)
        );
        assert_eq!(
            parse_utc_timestamp("2000-02-29T00:00:01+00:00"),
            Some(951_782_401)
        );
        assert_eq!(parse_utc_timestamp("2026-05-01 12:30:15"), None);
        assert_eq!(parse_utc_timestamp("2026-13-01T00:00:00Z"), None);
        assert_eq!(parse_utc_timestamp("garbage"), None);
    }

    #[test]
    fn token_from_the_environment_and_clear_errors() {
        let gw = Gateway::parse("http://127.0.0.1:1", &host(&[(TOKEN_VAR, "t")])).unwrap();
        assert_eq!(gw.token.as_deref(), Some("t"));
        assert_eq!(gw.kernel_name, "python3");
        let gw = Gateway::parse("http://h/?framing=legacy", &host(&[])).unwrap();
        let req = gw.channels_request("k", "s").unwrap();
        assert!(!req.headers().contains_key("Sec-WebSocket-Protocol"));
        let err = Gateway::parse("http://h/?tokn=x", &host(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown kernel gateway URL parameter `tokn`"),
            "{err}"
        );
        let err = Gateway::parse("ftp://x", &host(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("http:// or https://"), "{err}");
        let err = Gateway::parse("http://x/?token=${NOPE}", &host(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("NOPE"), "{err}");
    }

    /// A server answering `statuses` in turn, one per connection; returns its port and the
    /// request lines it saw.
    async fn answering(
        statuses: &'static [&'static str],
    ) -> (u16, tokio::task::JoinHandle<Vec<String>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = tokio::spawn(async move {
            let mut seen = Vec::new();
            for status in statuses {
                let (mut sock, _) = listener.accept().await.unwrap();
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = sock.read(&mut buf).await.unwrap();
                    assert!(n > 0, "the client closed mid-request");
                    request.extend_from_slice(&buf[..n]);
                }
                let text = String::from_utf8_lossy(&request).to_string();
                seen.push(text.lines().next().unwrap_or_default().to_string());
                let reply =
                    format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                sock.write_all(reply.as_bytes()).await.unwrap();
            }
            seen
        });
        (port, seen)
    }

    #[tokio::test]
    async fn delete_asks_again_while_the_server_fails() {
        // What Jupyter Server does to a delete that arrives while it restarts the kernel.
        let (port, seen) = answering(&[
            "500 Internal Server Error",
            "500 Internal Server Error",
            "204 No Content",
        ])
        .await;
        let gw = Gateway::parse(&format!("http://127.0.0.1:{port}"), &host(&[])).unwrap();
        gw.delete("k1").await.unwrap();
        assert_eq!(
            seen.await.unwrap(),
            vec!["DELETE /api/kernels/k1 HTTP/1.1"; 3]
        );
    }

    #[tokio::test]
    async fn delete_does_not_repeat_a_refused_request() {
        let (port, seen) = answering(&["400 Bad Request"]).await;
        let gw = Gateway::parse(&format!("http://127.0.0.1:{port}"), &host(&[])).unwrap();
        let err = gw.delete("k1").await.unwrap_err().to_string();
        assert!(err.contains("deleting kernel k1"), "{err}");
        assert!(err.contains("400"), "{err}");
        assert_eq!(seen.await.unwrap(), vec!["DELETE /api/kernels/k1 HTTP/1.1"]);
    }
}
