//! [bin] `serve --http`'s flags -> [`HttpOptions`]: the address (read first, before anything
//! is set up), the tokens, the session handles' key, the limits and timeouts.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use ipybox::host_env::HostEnv;

use super::super::flags::HttpArgs;
use super::super::flags::units::{nonzero_secs, nonzero_size};
use super::super::http;
use super::super::own_secrets;

/// `--http HOST:PORT`, resolved; refused with an example of what to pass.
pub(crate) async fn bind_address(spec: &str) -> anyhow::Result<SocketAddr> {
    tokio::net::lookup_host(spec)
        .await
        .ok()
        .and_then(|mut addrs| addrs.next())
        .with_context(|| {
            format!("invalid --http `{spec}`\n  help: pass HOST:PORT, e.g. 127.0.0.1:8000 or 0.0.0.0:8000")
        })
}

/// `--session-network` and the egress proxy's flags (`--session-allow-net`, `-domain`,
/// `-port`) apply only to sessions ipybox confines itself: given where they cannot apply, they
/// are an error at start-up rather than silently ignored (issue 51).
pub(crate) fn check_session_network(
    http: &HttpArgs,
    gateway: bool,
    sandbox: bool,
) -> anyhow::Result<()> {
    use ipybox::confine::network::SessionNetwork;
    let proxy_flag = [
        (!http.session_allow_net.is_empty()).then_some("--session-allow-net"),
        (!http.session_allow_domain.is_empty()).then_some("--session-allow-domain"),
        (!http.session_allow_port.is_empty()).then_some("--session-allow-port"),
    ]
    .into_iter()
    .flatten()
    .next();
    let given = match (http.session_network, proxy_flag) {
        (Some(mode), _) => format!("--session-network {}", mode.as_str()),
        (None, Some(flag)) => flag.to_string(),
        (None, None) => return Ok(()),
    };
    if gateway {
        anyhow::bail!(
            "{given} cannot apply to kernels on a Jupyter server (--kernel-gateway): they run with the network of the server's machine or pod, which ipybox does not confine
  help: restrict the kernels' network where they run (e.g. a NetworkPolicy for the kernel pods), and drop {given}"
        );
    }
    if sandbox {
        anyhow::bail!(
            "{given} cannot apply with --sandbox: srt confines each kernel and its policy says what it reaches (`network.allowedDomains`, `network.deniedDomains` in --sandbox-config)
  help: drop {given} and set the network in the sandbox policy, or drop --sandbox (sessions are then confined by ipybox, whose egress proxy these flags configure)"
        );
    }
    let mode = http.session_network.unwrap_or_default();
    if http.unconfined_sessions && !(mode == SessionNetwork::Host && proxy_flag.is_none()) {
        anyhow::bail!(
            "{given} cannot apply with --unconfined-sessions: unconfined kernels run in the host's network (its loopback, ipybox's port, the cloud metadata address), with no namespace or proxy of their own
  help: drop --unconfined-sessions (sessions are confined by default, and then {given} applies), or drop {given}"
        );
    }
    if let Some(flag) = proxy_flag
        && mode != SessionNetwork::Proxy
    {
        anyhow::bail!(
            "{flag} configures the egress proxy, and with --session-network {} sessions have none
  help: use --session-network proxy (the default), or drop {flag}",
            mode.as_str()
        );
    }
    Ok(())
}

/// Checks `--http`'s flags and collects what the HTTP server needs (`addr`: read first, by
/// [`bind_address`]; `checkpoint_after`: the server's flag, shared with stdio).
pub(crate) struct Service {
    pub addr: SocketAddr,
    pub gateway: bool,
    pub confined: bool,
    pub memory: Option<ipybox::confine::service::MemoryBudget>,
    pub checkpoint_after: Option<Duration>,
}

pub(crate) fn http_options(
    args: &HttpArgs,
    secrets: own_secrets::OwnSecrets,
    service: Service,
) -> anyhow::Result<http::HttpOptions> {
    let Service {
        addr,
        gateway,
        confined,
        memory,
        checkpoint_after,
    } = service;
    let tokens = http::auth::Tokens::load(&args.token, secrets.token.as_deref(), &args.token_file)?;
    let positive = |value: super::super::flags::units::Secs, flag: &str| {
        value.positive(flag, "").map_err(anyhow::Error::msg)
    };
    for (value, flag) in [
        (args.session_memory, "--session-memory"),
        (args.session_work_size, "--session-work-size"),
        (args.session_box_size, "--session-box-size"),
    ] {
        nonzero_size(value, flag).map_err(anyhow::Error::msg)?;
    }
    let hibernate_after =
        nonzero_secs(args.hibernate_after, "--hibernate-after").map_err(anyhow::Error::msg)?;
    let snapshot_quota =
        nonzero_size(args.snapshot_quota, "--snapshot-quota").map_err(anyhow::Error::msg)?;
    let default_idle = if hibernate_after.is_some() && !gateway {
        Duration::from_secs(86_400 * 7)
    } else {
        Duration::from_secs(1800)
    };
    let idle_timeout = match args.idle_timeout {
        Some(value) => positive(value, "--idle-timeout")?,
        None => default_idle,
    };
    let shutdown_grace = positive(args.shutdown_grace, "--shutdown-grace")?;
    let first_request = positive(args.first_request_timeout, "--first-request-timeout")?;
    let keep_alive = positive(args.keep_alive_timeout, "--keep-alive-timeout")?;
    for (value, flag) in [
        (args.max_sessions, "--max-sessions"),
        (args.max_concurrent_calls, "--max-concurrent-calls"),
        (args.max_body_bytes.bytes(), "--max-body-bytes"),
        (args.max_connections, "--max-connections"),
        (
            args.max_connections_per_address,
            "--max-connections-per-address",
        ),
    ] {
        if value == 0 {
            anyhow::bail!("invalid {flag} 0\n  help: pass a positive number");
        }
    }
    let data_dir = HostEnv::from_process().data_dir();
    let replica = match args.replica_id.clone() {
        Some(name) if http::handle::valid_replica(&name) => name,
        Some(name) => anyhow::bail!(
            "invalid --replica-id `{name}`\n  help: use 1-32 letters, digits, `-` or `_` (not `gw`)"
        ),
        None => default_replica(),
    };
    let session_key = session_key(
        args.session_secret_file.as_deref(),
        secrets.session_secret,
        data_dir.as_deref(),
    )?;
    // (Said after every flag is checked: a refusal comes first.)
    if !tokens.any() && addr.ip().is_loopback() {
        tracing::warn!(
            "no token: any local user who can reach {addr} can run code as ipybox's user; pass --token-file FILE (or IPYBOX_TOKEN) so that only clients with a token are served"
        );
    }
    let per_token = http::admission::per_token(
        &args.max_sessions_per_token,
        args.max_sessions,
        tokens.count(),
    )
    .map_err(anyhow::Error::msg)?;
    Ok(http::HttpOptions {
        addr,
        tokens,
        allowed_hosts: args.allowed_host.clone(),
        allowed_origins: args.allowed_origin.clone(),
        max_body_bytes: args.max_body_bytes.bytes(),
        shutdown_grace,
        session_header: args.session_header,
        trust_tenants: args.trust_tenants,
        tenant_gap: None,
        sessions: http::sessions::SessionConfig {
            idle_timeout,
            max_sessions: args.max_sessions,
            max_per_token: per_token,
            memory,
            max_concurrent_calls: Some(args.max_concurrent_calls),
            replica,
            gateway,
            confined,
            warm_sessions: args.warm_sessions,
            allow_install: args.allow_install,
            allow_register: args.allow_register,
            hibernate_after,
            checkpoint_after,
            snapshot_quota,
            data_dir: data_dir.clone(),
            snapshot_dir: args.snapshot_dir.clone(),
        },
        session_key,
        connections: http::connections::Limits {
            max_connections: args.max_connections,
            max_per_address: args.max_connections_per_address,
            first_request,
            keep_alive,
        },
    })
}

/// This replica's default name in handles: the host name, made valid (a pod's name on
/// Kubernetes), else a random one.
fn default_replica() -> String {
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    let name: String = host
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(32)
        .collect();
    if http::handle::valid_replica(&name) {
        name
    } else {
        format!("r{:08x}", rand::random::<u32>())
    }
}

/// The key of session handles: `--session-secret-file`, else IPYBOX_SESSION_SECRET, else one
/// kept in the data directory (so handles outlive a restart), else a random one.
fn session_key(
    file: Option<&std::path::Path>,
    secret: Option<String>,
    data_dir: Option<&std::path::Path>,
) -> anyhow::Result<Vec<u8>> {
    Ok(match (file, secret) {
        (Some(file), _) => {
            let key = std::fs::read(file)
                .with_context(|| format!("cannot read --session-secret-file {}", file.display()))?;
            let key = key.trim_ascii().to_vec();
            if key.len() < 16 {
                anyhow::bail!(
                    "the session secret in {} is shorter than 16 bytes\n  help: write a long random value, e.g. `openssl rand -hex 32 > FILE`",
                    file.display()
                );
            }
            key
        }
        (None, Some(secret)) if secret.len() >= 16 => secret.into_bytes(),
        (None, Some(_)) => anyhow::bail!(
            "IPYBOX_SESSION_SECRET is shorter than 16 bytes\n  help: use a long random value, e.g. `openssl rand -hex 32`"
        ),
        (None, None) => match data_dir {
            Some(dir) => {
                let path = ipybox::snapshot::session_key_path(dir);
                ipybox::snapshot::host_key(&path)
                    .with_context(|| {
                        format!(
                            "cannot read or create the session key {}\n  help: check that ipybox's data directory is writable, or pass --session-secret-file",
                            path.display()
                        )
                    })?
                    .to_vec()
            }
            None => {
                tracing::warn!(
                    "no data directory (set IPYBOX_HOME): session handles will not outlive this process"
                );
                rand::random::<[u8; 32]>().to_vec()
            }
        },
    })
}
