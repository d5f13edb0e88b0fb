//! Helpers to start real MCP servers for tests: the Python fixture (`tests/fixtures/mcp_fixture.py`)
//! and `@modelcontextprotocol/server-everything`, from the test environment that
//! `scripts/test-env.sh` provisions under `target/test-env/`.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn require(path: PathBuf) -> String {
    assert!(
        path.exists(),
        "{} is missing: run `bash scripts/test-env.sh` first to provision the test environment",
        path.display()
    );
    path.to_string_lossy().into_owned()
}

/// Python of the test venv (has `mcp`).
pub fn python() -> String {
    require(root().join("target/test-env/venv/bin/python"))
}

/// The `mcp-server-everything` launcher.
pub fn everything_bin() -> String {
    require(root().join("target/test-env/node_modules/.bin/mcp-server-everything"))
}

pub fn fixture_script() -> String {
    require(root().join("tests/fixtures/mcp_fixture.py"))
}

/// The process environment, as ipybox would pass it to the session layer.
pub fn process_env() -> HashMap<String, String> {
    std::env::vars().collect()
}

/// stdio params for the fixture in `mode` (`stdio`, `crash`, `hang`).
pub fn fixture_stdio_params(mode: &str) -> Value {
    json!({"command": python(), "args": [fixture_script(), mode]})
}

pub fn everything_stdio_params() -> Value {
    json!({"command": everything_bin(), "args": ["stdio"]})
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A server process listening on a loopback port; killed on drop.
pub struct HttpServer {
    child: Child,
    pub port: u16,
}

impl HttpServer {
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    fn wait_ready(mut self) -> Self {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return self;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("test MCP server exited early ({status})");
            }
            assert!(
                Instant::now() < deadline,
                "test MCP server did not listen on port {} within 30 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the Python fixture over `sse` or `http` (streamable), optionally at a custom path.
pub fn start_fixture(mode: &str, path: Option<&str>) -> HttpServer {
    let port = free_port();
    let mut cmd = Command::new(python());
    cmd.arg(fixture_script()).arg(mode).arg(port.to_string());
    if let Some(p) = path {
        cmd.arg(p);
    }
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn fixture");
    HttpServer { child, port }.wait_ready()
}

/// Starts server-everything over `sse` or `streamableHttp`.
pub fn start_everything(mode: &str) -> HttpServer {
    let port = free_port();
    let child = Command::new(everything_bin())
        .arg(mode)
        .env("PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn server-everything");
    HttpServer { child, port }.wait_ready()
}

/// True while a process with this pid exists (zombies count as existing).
pub fn pid_exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}
