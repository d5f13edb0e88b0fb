//! Which of the host's environment variables reach the processes ipybox starts (the kernel and
//! stdio MCP servers), beyond what each of them sets itself. Everything else — API keys, cloud
//! credentials — stays out unless the user passes it explicitly.

/// Identity and locale.
pub const IDENTITY: &[&str] = &["HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ"];

/// What HTTPS needs behind a proxy or with a custom CA bundle (pip, npx, uvx, requests).
pub const NETWORK: &[&str] = &[
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
];
