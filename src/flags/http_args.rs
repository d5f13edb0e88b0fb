//! [bin] `ipybox serve --http`'s flags: the service, its sessions' confinement and limits, and
//! hibernation. Sizes and durations: [`super::units`]. What they configure is built in
//! `serve::http_options` and `serve::confinement`.

use std::path::PathBuf;

use super::headings::{CONFINEMENT, HIBERNATION, HTTP, NOTEBOOKS};
use super::units::{OrOff, Secs, Size};
use ipybox::confine::network::{Cidr, DomainPattern, SessionNetwork};

/// `ipybox serve --http`: MCP over Streamable HTTP, a kernel per agent session. (Its `Debug`
/// shows no token.)
#[derive(clap::Args)]
pub(crate) struct HttpArgs {
    /// Serve MCP over Streamable HTTP at http://HOST:PORT/mcp instead of stdio (e.g.
    /// 127.0.0.1:8000; anything but loopback needs a token).
    #[arg(long, value_name = "HOST:PORT", help_heading = HTTP)]
    pub http: Option<String>,
    /// A bearer token clients must send; repeatable. Prefer --token-file or IPYBOX_TOKEN (a
    /// command line is visible to other local users).
    #[arg(long, value_name = "TOKEN", requires = "http", help_heading = HTTP)]
    pub token: Vec<String>,
    /// A file of bearer tokens, one per line (`#` comments); repeatable. Sessions belong to the
    /// token that made them.
    #[arg(long, value_name = "FILE", requires = "http", help_heading = HTTP)]
    pub token_file: Vec<PathBuf>,
    /// A `Host` header value to accept; repeatable [default: the loopback names on loopback,
    /// any host otherwise].
    #[arg(long, value_name = "HOST", requires = "http", help_heading = HTTP)]
    pub allowed_host: Vec<String>,
    /// A browser origin to accept (e.g. https://app.example.com:443); repeatable. Another
    /// `Origin` is refused (403).
    #[arg(long, value_name = "ORIGIN", requires = "http", help_heading = HTTP)]
    pub allowed_origin: Vec<String>,
    /// The largest request body accepted (size; larger: 413).
    #[arg(long, value_name = "SIZE", default_value = "4M", requires = "http", help_heading = HTTP)]
    pub max_body_bytes: Size,
    /// A session with no call for this long is gone: kernel stopped, saved state deleted
    /// (duration) [default: 7d; 30m with --hibernate-after off].
    #[arg(long, value_name = "DURATION", requires = "http", help_heading = HIBERNATION)]
    pub idle_timeout: Option<Secs>,
    /// A session with no call for this long is saved to disk and its kernel stopped; its next
    /// call restores it (duration, or `off`). Local kernels only.
    #[arg(long, value_name = "DURATION|off", default_value = "10m", requires = "http", help_heading = HIBERNATION)]
    pub hibernate_after: OrOff<Secs>,
    /// The disk a token's saved sessions may take (size, or `off`); past it its least recently
    /// used ones are deleted.
    #[arg(long, value_name = "SIZE|off", default_value = "4G", requires = "http", help_heading = HIBERNATION)]
    pub snapshot_quota: OrOff<Size>,
    /// The disk a token's session notebooks may take (size, or `off`); past it its least
    /// recently written ones are removed.
    #[arg(long, value_name = "SIZE|off", default_value = "256M", requires = "http", help_heading = NOTEBOOKS)]
    pub notebook_quota: OrOff<Size>,
    /// Where saved sessions live instead of $IPYBOX_HOME: storage replicas share, so one
    /// restores a dead one's sessions.
    #[arg(long, value_name = "DIR", requires = "http", help_heading = HIBERNATION)]
    pub snapshot_dir: Option<PathBuf>,
    /// At most this many kernel sessions at once; one more is refused (nothing is evicted).
    #[arg(long, value_name = "N", default_value_t = 32, requires = "http", help_heading = CONFINEMENT)]
    pub max_sessions: usize,
    /// At most this many sessions per token: N, `auto` (--max-sessions shared out among
    /// several tokens) or `off`.
    #[arg(long, value_name = "N|auto|off", default_value = "auto", requires = "http", help_heading = CONFINEMENT)]
    pub max_sessions_per_token: String,
    /// Memory all confined sessions may use together, each's --session-memory reserved in
    /// full (size, `auto`: 90% of this machine's, or `off`).
    #[arg(long, value_name = "SIZE|auto|off", default_value = "auto", value_parser = parse_service_memory, requires = "http", help_heading = CONFINEMENT)]
    pub service_memory: String,
    /// At most this many calls in progress per session; more are refused at once.
    #[arg(long, value_name = "N", default_value_t = 4, requires = "http", help_heading = CONFINEMENT)]
    pub max_concurrent_calls: usize,
    /// Kernels started ahead for new sessions (a new session's first cell does not wait for
    /// one).
    #[arg(long, value_name = "N", default_value_t = 1, requires = "http", help_heading = HTTP)]
    pub warm_sessions: usize,
    /// This replica's name in session handles (a load balancer's routing key) [default: the
    /// host name].
    #[arg(long, value_name = "NAME", requires = "http", help_heading = HTTP)]
    pub replica_id: Option<String>,
    /// Declare `session` as a header parameter (SEP-2243): 2026-07-28 clients also send it as
    /// `Mcp-Param-Session`.
    #[arg(long, requires = "http", help_heading = HTTP)]
    pub session_header: bool,
    /// A file with the key of session handles, shared by replicas (or IPYBOX_SESSION_SECRET)
    /// [default: $IPYBOX_HOME/keys/session.key].
    #[arg(long, value_name = "FILE", requires = "http", help_heading = HTTP)]
    pub session_secret_file: Option<PathBuf>,
    /// Let clients call install_package (it changes the environment every session shares).
    #[arg(long, requires = "http", help_heading = CONFINEMENT)]
    pub allow_install: bool,
    /// Let clients call register_mcp_server (this host then runs the commands they name, as
    /// ipybox's user, unconfined).
    #[arg(long, requires = "http", help_heading = CONFINEMENT)]
    pub allow_register: bool,
    /// Let several tokens share local kernels that do not keep them apart, and MCP server
    /// processes.
    #[arg(long, requires = "http", help_heading = CONFINEMENT)]
    pub trust_tenants: bool,
    /// Run local kernels unconfined: each session's code runs as ipybox's user and reaches
    /// every other session [default: a bubblewrap per session].
    #[arg(long, requires = "http", help_heading = CONFINEMENT)]
    pub unconfined_sessions: bool,
    /// Processes and threads each confined session may have (N, or `off`); a fork past it
    /// fails with EAGAIN.
    #[arg(long, requires = "http", value_name = "N|off", default_value_t = ipybox::confine::limits::DEFAULT_MAX_PROCS, value_parser = parse_procs, help_heading = CONFINEMENT)]
    pub session_max_procs: u64,
    /// Memory each confined session may use, no swap, its work files counted (size, or `off`);
    /// past it the kernel restarts.
    #[arg(long, requires = "http", value_name = "SIZE|off", default_value = "2G", help_heading = CONFINEMENT)]
    pub session_memory: OrOff<Size>,
    /// CPU each confined session may use, in cores (0.5, 1, 2), or `off`.
    #[arg(long, requires = "http", value_name = "CORES|off", default_value = "off", value_parser = parse_cpus, help_heading = CONFINEMENT)]
    pub session_cpus: f64,
    /// Size of each confined session's work directory (size, or `off`; as root a tmpfs counted
    /// in --session-memory).
    #[arg(long, requires = "http", value_name = "SIZE|off", default_value = "1G", help_heading = CONFINEMENT)]
    pub session_work_size: OrOff<Size>,
    /// Size of each confined session's kernel directory, `box/`: its sockets (size, or `off`;
    /// as root a tmpfs counted in --session-memory; snapshots do not pass through it).
    #[arg(long, requires = "http", value_name = "SIZE|off", default_value = "16M", help_heading = CONFINEMENT)]
    pub session_box_size: OrOff<Size>,
    /// What a confined kernel reaches: `none` (only lo), `proxy` (public addresses through
    /// ipybox's proxy) or `host` [default: proxy].
    #[arg(long, value_name = "MODE", requires = "http", help_heading = CONFINEMENT)]
    pub session_network: Option<SessionNetwork>,
    /// Let confined sessions reach this non-public range through the proxy (e.g.
    /// 10.1.2.0/24); repeatable.
    #[arg(long, value_name = "CIDR", requires = "http", help_heading = CONFINEMENT)]
    pub session_allow_net: Vec<Cidr>,
    /// With the proxy, the only domains sessions reach (`pypi.org`, `*.example.com`);
    /// repeatable [default: any public].
    #[arg(long, value_name = "DOMAIN", requires = "http", help_heading = CONFINEMENT)]
    pub session_allow_domain: Vec<DomainPattern>,
    /// A port the proxy connects to besides 80 and 443; repeatable.
    #[arg(long, value_name = "PORT", requires = "http", help_heading = CONFINEMENT)]
    pub session_allow_port: Vec<u16>,
    /// The uids confined kernels run as, one per session: FIRST-LAST, `auto` (as root a range
    /// systemd leaves unused) or `none`.
    #[arg(long, value_name = "FIRST-LAST", default_value = "auto", requires = "http", help_heading = CONFINEMENT)]
    pub session_uids: ipybox::confine::uids::UidSetting,
    /// Show this host path read-only, at its own path, to every confined kernel; repeatable.
    #[arg(long, value_name = "PATH", requires = "http", help_heading = CONFINEMENT)]
    pub session_show: Vec<PathBuf>,
    /// Give every session MCP server processes of its own (default: one per server, shared
    /// by all sessions).
    #[arg(long, requires = "http", help_heading = HTTP)]
    pub per_session_mcp_servers: bool,
    /// On SIGTERM/SIGINT, how long running calls may take to finish before they are cancelled
    /// (duration).
    #[arg(long, value_name = "DURATION", default_value = "10s", requires = "http", help_heading = HTTP)]
    pub shutdown_grace: Secs,
    /// At most this many connections at once (at the cap a new one replaces an idle one).
    #[arg(long, value_name = "N", default_value_t = 4096, requires = "http", help_heading = HTTP)]
    pub max_connections: usize,
    /// At most this many unauthenticated connections per client address (IPv6: per /64).
    #[arg(long, value_name = "N", default_value_t = 64, requires = "http", help_heading = HTTP)]
    pub max_connections_per_address: usize,
    /// A new connection must send a whole request head within this long (duration).
    #[arg(long, value_name = "DURATION", default_value = "5s", requires = "http", help_heading = HTTP)]
    pub first_request_timeout: Secs,
    /// A connection idle between requests is closed after this long (duration).
    #[arg(long, value_name = "DURATION", default_value = "2m", requires = "http", help_heading = HTTP)]
    pub keep_alive_timeout: Secs,
}

impl std::fmt::Debug for HttpArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpArgs")
            .field("http", &self.http)
            .field("token", &format_args!("<{} redacted>", self.token.len()))
            .field("token_file", &self.token_file)
            .finish_non_exhaustive()
    }
}

/// `--service-memory`: `auto`, `off`, or a size (as bytes: what `http::admission` reads).
fn parse_service_memory(text: &str) -> Result<String, String> {
    match text.trim() {
        v @ ("auto" | "off") => Ok(v.to_string()),
        v => v
            .parse::<Size>()
            .map(|s| s.0.to_string())
            .map_err(|e| format!("{e}; or `auto` or `off`")),
    }
}

/// `--session-max-procs`: N, or `off` (no limit: 0 inside); 0 is refused.
fn parse_procs(text: &str) -> Result<u64, String> {
    match text.trim() {
        "off" => Ok(0),
        n => match n.parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!(
                "`{text}` is not a number of processes: pass 1 or more, or `off` for no limit"
            )),
        },
    }
}

/// `--session-cpus`: cores, or `off` (`none` too; no limit: 0 inside); 0 is refused.
fn parse_cpus(text: &str) -> Result<f64, String> {
    match text.trim() {
        "off" | "none" => Ok(0.0),
        "0" => {
            Err("0 cores would run nothing: pass cores (0.5, 1, 2), or `off` for no limit".into())
        }
        t => ipybox::confine::limits::parse_cpus(t)
            .map(|c| c.unwrap_or(0.0))
            .map_err(|_| {
                format!(
                    "`{text}` is not a number of cores: pass 0.5, 1, 2, ..., or `off` for no limit"
                )
            }),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn procs_and_cpus_take_off_and_refuse_zero() {
        assert_eq!(super::parse_procs("50"), Ok(50));
        assert_eq!(super::parse_procs("off"), Ok(0));
        assert!(super::parse_procs("0").is_err());
        assert_eq!(super::parse_cpus("0.5"), Ok(0.5));
        assert_eq!(super::parse_cpus("off"), Ok(0.0));
        assert_eq!(super::parse_cpus("none"), Ok(0.0));
        assert!(super::parse_cpus("0").is_err());
        assert!(super::parse_cpus("x").is_err());
    }
}
