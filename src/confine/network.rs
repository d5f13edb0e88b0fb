//! What a confined session's kernel may reach on the network (`--session-network`), and the
//! address and name checks of the egress proxy ([`super::egress_proxy`]).
//!
//! - [`SessionNetwork::None`]: a network namespace of its own with only `lo`: no egress at all.
//! - [`SessionNetwork::Proxy`] (the default): a network namespace of its own; the kernel's only
//!   way out is ipybox's egress proxy on the host, reached over a Unix socket in its runtime
//!   directory (bridged to `127.0.0.1:`[`BRIDGE_PORT`] inside the namespace by
//!   `python/ipybox_runtime/net_bridge.py`). The proxy resolves names on the host, refuses
//!   loopback, link-local (the cloud metadata address), private, CGNAT, unspecified, multicast,
//!   broadcast and reserved addresses, and every address of the host itself (any interface,
//!   both families, read with `getifaddrs` at each connection: [`OwnAddresses`]), unless an
//!   `--session-allow-net` CIDR covers them, refuses names that no `--session-allow-domain`
//!   pattern matches (when any is given), and ports other than 80, 443 and
//!   `--session-allow-port` (any port in an allowed CIDR).
//! - [`SessionNetwork::Host`]: the host's network namespace (ipybox's behaviour before 0.x).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

/// The port inside a proxied kernel's network namespace where the bridge to the egress proxy
/// listens (the kernel's `HTTP_PROXY` is `http://127.0.0.1:3128`).
pub const BRIDGE_PORT: u16 = 3128;

/// The name of the egress proxy's socket in a kernel's runtime directory.
pub const EGRESS_SOCKET: &str = "egress.sock";

/// The kernel's variable naming the egress proxy's socket (the bridge connects to it).
pub const EGRESS_SOCKET_ENV: &str = "IPYBOX_EGRESS_SOCKET";

/// The kernel's proxy variables for `--session-network proxy` (upper and lower case: curl reads
/// only `http_proxy` in lower case; pip, uv, requests and urllib read either).
pub fn proxy_env(socket: &std::path::Path) -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{BRIDGE_PORT}");
    let no_proxy = "localhost,127.0.0.1,::1".to_string();
    let mut env = vec![(EGRESS_SOCKET_ENV.to_string(), socket.display().to_string())];
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        env.push((name.to_string(), url.clone()));
        env.push((name.to_ascii_lowercase(), url.clone()));
    }
    env.push(("NO_PROXY".into(), no_proxy.clone()));
    env.push(("no_proxy".into(), no_proxy));
    env.push(("PIP_PROXY".into(), url));
    env
}

/// At most this many proxied connections at once per session (more wait for one to end).
pub const MAX_CONNECTIONS_PER_SESSION: usize = 32;

/// A client must send its request head within this long.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Connecting to the destination may take this long.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Resolving the destination's name may take this long.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// A tunnel or forwarded request with no byte either way for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Ports a destination outside the allowed CIDRs may use, besides `--session-allow-port`.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// Which network a confined session's kernel has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionNetwork {
    /// Its own network namespace with only `lo`.
    None,
    /// Its own network namespace; egress through ipybox's proxy, by policy.
    #[default]
    Proxy,
    /// The host's network namespace.
    Host,
}

impl SessionNetwork {
    /// Whether the kernel gets a network namespace of its own.
    pub fn unshares(self) -> bool {
        self != Self::Host
    }

    /// The flag's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Proxy => "proxy",
            Self::Host => "host",
        }
    }
}

impl std::str::FromStr for SessionNetwork {
    type Err = NetworkError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Self::None),
            "proxy" => Ok(Self::Proxy),
            "host" => Ok(Self::Host),
            other => Err(NetworkError::Invalid {
                what: "--session-network".into(),
                value: other.into(),
                why: "expected `none`, `proxy` or `host`".into(),
            }),
        }
    }
}

/// Bad network policy input.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error("invalid {what} `{value}`: {why}")]
    Invalid {
        what: String,
        value: String,
        why: String,
    },
}

/// An address range, `10.1.2.0/24` or `fd00::/8` (a bare address is a /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `ip` is in this range (an IPv4-mapped IPv6 address counts as its IPv4 one).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl std::str::FromStr for Cidr {
    type Err = NetworkError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| NetworkError::Invalid {
            what: "--session-allow-net".into(),
            value: s.into(),
            why: format!("{why} (expected an address range such as 10.1.2.0/24 or fd00::/8)"),
        };
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr.trim().parse().map_err(|_| bad("not an IP address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| bad(&format!("the prefix length must be 0 to {max}")))?,
            None => max,
        };
        Ok(Self {
            addr: canonical(addr),
            prefix: if canonical(addr).is_ipv4() && !addr.is_ipv4() {
                prefix.saturating_sub(96)
            } else {
                prefix
            },
        })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// A domain pattern: `example.com` (that name only) or `*.example.com` (its subdomains, not
/// the name itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainPattern(String);

impl DomainPattern {
    /// Whether `host` (a name, any case, an optional trailing dot) matches.
    pub fn matches(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        match self.0.strip_prefix("*.") {
            Some(parent) => host
                .strip_suffix(parent)
                .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
            None => host == self.0,
        }
    }
}

impl std::str::FromStr for DomainPattern {
    type Err = NetworkError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let p = s.trim().trim_end_matches('.').to_ascii_lowercase();
        let name = p.strip_prefix("*.").unwrap_or(&p);
        let valid = !name.is_empty()
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            });
        if !valid {
            return Err(NetworkError::Invalid {
                what: "--session-allow-domain".into(),
                value: s.into(),
                why: "expected a domain name such as pypi.org, or *.example.com for its subdomains"
                    .into(),
            });
        }
        Ok(Self(p))
    }
}

impl std::fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a confined session may reach (see the module comment).
#[derive(Debug, Clone, Default)]
pub struct NetworkPolicy {
    /// The kind of network.
    pub mode: SessionNetwork,
    /// Ranges the proxy reaches although they are loopback, private, link-local, ... (any port).
    pub allow_nets: Vec<Cidr>,
    /// When not empty, the only names the proxy connects to (an IP literal must then be in
    /// `allow_nets`). Empty: every name whose addresses are public.
    pub allow_domains: Vec<DomainPattern>,
    /// Ports allowed besides [`DEFAULT_PORTS`].
    pub allow_ports: Vec<u16>,
}

/// Why the proxy refuses a destination: said in its 403 answer and logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub what: String,
    pub why: String,
    pub help: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ipybox refused {}: {}\n  help: {}",
            self.what, self.why, self.help
        )
    }
}

/// An IPv4-mapped IPv6 address as its IPv4 one; anything else unchanged.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// Why `ip` is not a public address, if it is not one.
pub fn special_kind(ip: IpAddr) -> Option<&'static str> {
    match canonical(ip) {
        IpAddr::V4(v4) => v4_kind(v4),
        IpAddr::V6(v6) => v6_kind(v6),
    }
}

fn v4_kind(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    if ip.is_loopback() {
        Some("a loopback address (the host's own services, ipybox's port)")
    } else if ip == Ipv4Addr::new(169, 254, 169, 254) {
        Some("the cloud instance metadata address")
    } else if ip.is_link_local() {
        Some("a link-local address")
    } else if ip.is_private() {
        Some("a private address (10/8, 172.16/12, 192.168/16)")
    } else if a == 100 && (64..128).contains(&b) {
        Some("a carrier-grade NAT address (100.64/10)")
    } else if ip.is_unspecified() || a == 0 {
        Some("an unspecified address (0/8)")
    } else if ip.is_broadcast() {
        Some("the broadcast address")
    } else if ip.is_multicast() {
        Some("a multicast address")
    } else if a >= 240 {
        Some("a reserved address (240/4)")
    } else {
        None
    }
}

fn v6_kind(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    if ip.is_loopback() {
        Some("a loopback address (the host's own services, ipybox's port)")
    } else if ip.is_unspecified() {
        Some("an unspecified address")
    } else if ip.is_multicast() {
        Some("a multicast address")
    } else if first & 0xffc0 == 0xfe80 {
        Some("a link-local address (fe80::/10)")
    } else if first & 0xfe00 == 0xfc00 {
        Some("a private (unique local) address (fc00::/7)")
    } else if first == 0xfec0 {
        Some("a site-local address (fec0::/10)")
    } else if u128::from(ip) >> 32 == 0 {
        // ::a.b.c.d (IPv4-compatible, deprecated): some stacks still route it to a.b.c.d.
        Some("an IPv4-compatible address (::/96)")
    } else if ip.segments()[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        Some("a NAT64 address (64:ff9b::/96, it reaches an IPv4 address through a gateway)")
    } else {
        None
    }
}

/// The addresses of the host's own interfaces (ipybox's network namespace: every interface,
/// up or down, IPv4 and IPv6), as `getifaddrs(3)` reads them now. A service the host binds to
/// all addresses (`0.0.0.0`, `::`) answers on each of them, public ones included: the proxy
/// refuses them like loopback ([`NetworkPolicy::check_own`]). Read again for every connection
/// (a few tens of microseconds), so an address added after start-up counts at once.
#[derive(Debug, Clone, Default)]
pub struct OwnAddresses(Vec<(IpAddr, String)>);

impl OwnAddresses {
    /// The host's addresses now. An error reading them is returned: the proxy then refuses
    /// (it cannot tell whether an address is the host's).
    pub fn read() -> std::io::Result<Self> {
        let mut found = Vec::new();
        let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
        // SAFETY: getifaddrs fills `list`, freed below with freeifaddrs; read only in between.
        if unsafe { libc::getifaddrs(&mut list) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut cur = list;
        while !cur.is_null() {
            // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
            let entry = unsafe { &*cur };
            let addr = entry.ifa_addr;
            // SAFETY: ifa_addr, when not null, points to a sockaddr of the family it names
            // (sockaddr_in for AF_INET, sockaddr_in6 for AF_INET6); ifa_name is a C string.
            let ip = unsafe {
                if addr.is_null() {
                    None
                } else if i32::from((*addr).sa_family) == libc::AF_INET {
                    let sin = &*(addr as *const libc::sockaddr_in);
                    Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                        sin.sin_addr.s_addr,
                    ))))
                } else if i32::from((*addr).sa_family) == libc::AF_INET6 {
                    let sin6 = &*(addr as *const libc::sockaddr_in6);
                    Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
                } else {
                    None
                }
            };
            if let Some(ip) = ip {
                // SAFETY: as above.
                let name = unsafe { std::ffi::CStr::from_ptr(entry.ifa_name) }
                    .to_string_lossy()
                    .into_owned();
                found.push((canonical(ip), name));
            }
            cur = entry.ifa_next;
        }
        // SAFETY: the list getifaddrs returned, freed once.
        unsafe { libc::freeifaddrs(list) };
        Ok(Self(found))
    }

    /// Addresses given by hand (tests).
    pub fn from_list(list: Vec<(IpAddr, String)>) -> Self {
        Self(
            list.into_iter()
                .map(|(ip, name)| (canonical(ip), name))
                .collect(),
        )
    }

    /// Each address with its interface's name.
    pub fn list(&self) -> &[(IpAddr, String)] {
        &self.0
    }

    /// The interface `ip` belongs to, if it is one of the host's addresses.
    pub fn interface_of(&self, ip: IpAddr) -> Option<&str> {
        let ip = canonical(ip);
        self.0
            .iter()
            .find(|(own, _)| *own == ip)
            .map(|(_, name)| name.as_str())
    }
}

impl NetworkPolicy {
    /// Whether an `--session-allow-net` range covers `ip`.
    pub fn allowed_net(&self, ip: IpAddr) -> bool {
        self.allow_nets.iter().any(|c| c.contains(ip))
    }

    /// The check of a destination's name or IP literal, before it is resolved.
    pub fn check_host(&self, host: &str, port: u16) -> Result<(), Refusal> {
        let shown = display_host(host, port);
        if let Ok(ip) = host.trim_matches(['[', ']']).parse::<IpAddr>() {
            if self.allowed_net(ip) {
                return Ok(());
            }
            if special_kind(ip).is_some() {
                return self.check_address(host, ip, port);
            }
            if !self.allow_domains.is_empty() {
                return Err(Refusal {
                    what: shown,
                    why: "an IP address, and this service lets sessions reach only the domains it names".into(),
                    help: format!(
                        "the operator can allow the address with `--session-allow-net {ip}/{}`",
                        if ip.is_ipv4() { 32 } else { 128 }
                    ),
                });
            }
        } else if !self.allow_domains.is_empty()
            && !self.allow_domains.iter().any(|d| d.matches(host))
        {
            let list: Vec<String> = self.allow_domains.iter().map(|d| d.to_string()).collect();
            return Err(Refusal {
                what: shown,
                why: format!(
                    "`{host}` is not a domain this service lets sessions reach (allowed: {})",
                    list.join(", ")
                ),
                help: format!(
                    "the operator can allow it with `--session-allow-domain {}`",
                    host.trim_end_matches('.').to_ascii_lowercase()
                ),
            });
        }
        self.check_port(host, port)
    }

    fn check_port(&self, host: &str, port: u16) -> Result<(), Refusal> {
        if DEFAULT_PORTS.contains(&port) || self.allow_ports.contains(&port) {
            return Ok(());
        }
        // An address the operator allowed may use any port: checked once resolved.
        if let Ok(ip) = host.trim_matches(['[', ']']).parse::<IpAddr>()
            && self.allowed_net(ip)
        {
            return Ok(());
        }
        Err(Refusal {
            what: display_host(host, port),
            why: format!("port {port} is not one sessions may connect to (80 and 443 are)"),
            help: format!("the operator can allow it with `--session-allow-port {port}`"),
        })
    }

    /// The check of one address `host` resolved to: `Ok` when the proxy may connect to it.
    pub fn check_address(&self, host: &str, ip: IpAddr, port: u16) -> Result<(), Refusal> {
        if self.allowed_net(ip) {
            return Ok(());
        }
        if let Some(kind) = special_kind(ip) {
            let resolved = if host.trim_matches(['[', ']']).parse::<IpAddr>().is_ok() {
                String::new()
            } else {
                format!(" (`{host}` resolves to it)")
            };
            let net = if canonical(ip).is_ipv4() { 32 } else { 128 };
            return Err(Refusal {
                what: display_host(host, port),
                why: format!(
                    "{} is {kind}{resolved}; sessions reach only public addresses",
                    canonical(ip)
                ),
                help: format!(
                    "the operator can allow the range with `--session-allow-net {}/{net}` (or a wider CIDR)",
                    canonical(ip)
                ),
            });
        }
        if DEFAULT_PORTS.contains(&port) || self.allow_ports.contains(&port) {
            Ok(())
        } else {
            self.check_port(host, port)
        }
    }
}

impl NetworkPolicy {
    /// The check of the address the proxy is about to connect to against the host's own
    /// addresses (`own`, read just before): refused unless an `--session-allow-net` range covers
    /// it. Loopback and the other special kinds are refused first by [`Self::check_address`]
    /// with their own reason; this catches the rest (a public or documentation address on the
    /// host's NIC, where every service bound to all addresses answers).
    pub fn check_own(
        &self,
        host: &str,
        ip: IpAddr,
        port: u16,
        own: &OwnAddresses,
    ) -> Result<(), Refusal> {
        if self.allowed_net(ip) {
            return Ok(());
        }
        let Some(interface) = own.interface_of(ip) else {
            return Ok(());
        };
        let ip = canonical(ip);
        let resolved = if host.trim_matches(['[', ']']).parse::<IpAddr>().is_ok() {
            String::new()
        } else {
            format!(" (`{host}` resolves to it)")
        };
        let net = if ip.is_ipv4() { 32 } else { 128 };
        Err(Refusal {
            what: display_host(host, port),
            why: format!(
                "{ip} is an address of this host ({interface}){resolved}: the host's own services and ipybox's port answer there; sessions reach only other machines' public addresses"
            ),
            help: format!("the operator can allow it with `--session-allow-net {ip}/{net}`"),
        })
    }
}

/// `host:port`, IPv6 literals in brackets.
pub fn display_host(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn special_addresses_are_named() {
        for refused in [
            "127.0.0.1",
            "127.5.5.5",
            "169.254.169.254",
            "169.254.1.1",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "0.0.0.0",
            "0.1.2.3",
            "255.255.255.255",
            "224.0.0.1",
            "240.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "fc00::1",
            "fd12:3456::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a00:1",
        ] {
            assert!(special_kind(ip(refused)).is_some(), "{refused}");
        }
        for public in [
            "203.0.113.80",
            "192.0.2.2",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert_eq!(special_kind(ip(public)), None, "{public}");
        }
    }

    #[test]
    fn cidrs_parse_and_contain() {
        let c: Cidr = "10.88.0.0/16".parse().unwrap();
        assert!(c.contains(ip("10.88.3.4")));
        assert!(c.contains(ip("::ffff:10.88.3.4")));
        assert!(!c.contains(ip("10.89.0.1")));
        let one: Cidr = "127.0.0.1".parse().unwrap();
        assert!(one.contains(ip("127.0.0.1")) && !one.contains(ip("127.0.0.2")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("1.2.3.4")) && !all.contains(ip("::1")));
        let v6: Cidr = "fd00::/8".parse().unwrap();
        assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")));
        for bad in ["10.0.0.0/33", "x/8", "fd00::/129", "", "10.0.0.0/"] {
            let e = bad.parse::<Cidr>().unwrap_err().to_string();
            assert!(e.contains("--session-allow-net"), "{e}");
        }
    }

    #[test]
    fn domain_patterns_match_names_and_subdomains() {
        let exact: DomainPattern = "PyPI.org".parse().unwrap();
        assert!(exact.matches("pypi.org") && exact.matches("PYPI.ORG."));
        assert!(!exact.matches("evilpypi.org") && !exact.matches("x.pypi.org"));
        let sub: DomainPattern = "*.example.com".parse().unwrap();
        assert!(sub.matches("a.example.com") && sub.matches("a.b.example.com"));
        assert!(!sub.matches("example.com") && !sub.matches("badexample.com"));
        for bad in ["", "*.", "a..b", "a b", "*"] {
            assert!(bad.parse::<DomainPattern>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_policy_checks_names_ports_and_addresses() {
        let open = NetworkPolicy::default();
        assert!(open.check_host("example.com", 443).is_ok());
        let e = open.check_host("example.com", 22).unwrap_err();
        assert!(e.help.contains("--session-allow-port 22"), "{e}");
        let e = open
            .check_address("metadata.google.internal", ip("169.254.169.254"), 80)
            .unwrap_err();
        assert!(e.why.contains("metadata"), "{e}");
        assert!(
            e.help.contains("--session-allow-net 169.254.169.254/32"),
            "{e}"
        );
        assert!(
            open.check_address("pypi.org", ip("203.0.113.80"), 443)
                .is_ok()
        );

        let strict = NetworkPolicy {
            allow_domains: vec![
                "pypi.org".parse().unwrap(),
                "*.pythonhosted.org".parse().unwrap(),
            ],
            allow_nets: vec!["10.88.0.1/32".parse().unwrap()],
            allow_ports: vec![8443],
            ..Default::default()
        };
        assert!(strict.check_host("pypi.org", 443).is_ok());
        assert!(strict.check_host("files.pythonhosted.org", 443).is_ok());
        let e = strict.check_host("example.com", 443).unwrap_err();
        assert!(e.help.contains("--session-allow-domain example.com"), "{e}");
        assert!(strict.check_host("8.8.8.8", 443).is_err());
        assert!(strict.check_host("10.88.0.1", 8000).is_ok());
        assert!(
            strict
                .check_address("10.88.0.1", ip("10.88.0.1"), 8000)
                .is_ok()
        );
        assert!(strict.check_host("pypi.org", 8443).is_ok());
    }

    #[test]
    fn the_hosts_own_addresses_are_refused_unless_allowed() {
        let own = OwnAddresses::from_list(vec![
            (ip("192.0.2.2"), "eth0".into()),
            (ip("2001:db8::2"), "eth0".into()),
        ]);
        let open = NetworkPolicy::default();
        // Public by kind: check_address passes them; check_own does not.
        assert!(open.check_address("192.0.2.2", ip("192.0.2.2"), 80).is_ok());
        let e = open
            .check_own("192.0.2.2", ip("192.0.2.2"), 80, &own)
            .unwrap_err();
        assert!(e.why.contains("an address of this host (eth0)"), "{e}");
        assert!(e.help.contains("--session-allow-net 192.0.2.2/32"), "{e}");
        let e = open
            .check_own("me.example", ip("::ffff:192.0.2.2"), 443, &own)
            .unwrap_err();
        assert!(e.why.contains("`me.example` resolves to it"), "{e}");
        assert!(
            open.check_own("x", ip("2001:db8::2"), 443, &own)
                .unwrap_err()
                .help
                .contains("2001:db8::2/128")
        );
        // Another machine of the same network is not the host.
        assert!(open.check_own("x", ip("192.0.2.3"), 80, &own).is_ok());
        let allowed = NetworkPolicy {
            allow_nets: vec!["192.0.2.2/32".parse().unwrap()],
            ..Default::default()
        };
        assert!(allowed.check_own("x", ip("192.0.2.2"), 8000, &own).is_ok());
        // This machine's own list reads (lo at least).
        let here = OwnAddresses::read().unwrap();
        assert_eq!(here.interface_of(ip("127.0.0.1")), Some("lo"));
    }
}
