//! What `tests/integration/jupyter_servers.rs` needs from the test support module, for the
//! benchmarks that include it (`#[path]`, as `mod support`).

pub(crate) fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
