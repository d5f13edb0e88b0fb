//! Real Jupyter servers on loopback for the remote-kernel tests: Jupyter Kernel Gateway,
//! Jupyter Enterprise Gateway (its local process proxy) and Jupyter Server, from the venvs
//! `scripts/test-env.sh` makes in `target/test-env/jupyter/`. Each runs with a token, with kernel
//! listing on (so tests can see what is left on the server), and with its Jupyter paths in a
//! private directory (no user kernelspecs leak in).

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{free_port, root};

pub(crate) const TOKEN: &str = "test-token-0123";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    KernelGateway,
    EnterpriseGateway,
    JupyterServer,
}

pub(crate) const ALL: [Kind; 3] = [
    Kind::KernelGateway,
    Kind::EnterpriseGateway,
    Kind::JupyterServer,
];

pub(crate) struct JupyterServer {
    pub kind: Kind,
    pub port: u16,
    /// Whether the server's iopub rate limit is left on (its default).
    rate_limited: bool,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl JupyterServer {
    /// Starts a server with its iopub rate limit off, as docs/remote-kernels.md tells users to
    /// (the limit drops output of chatty cells).
    pub(crate) fn start(kind: Kind) -> Self {
        Self::start_with(kind, false)
    }

    /// Starts a server with its default iopub rate limit.
    pub(crate) fn start_rate_limited(kind: Kind) -> Self {
        Self::start_with(kind, true)
    }

    fn start_with(kind: Kind, rate_limited: bool) -> Self {
        let mut server = Self {
            kind,
            port: free_port(),
            rate_limited,
            child: None,
            dir: tempfile::tempdir().unwrap(),
        };
        server.launch();
        server
    }

    fn launch(&mut self) {
        let (venv, mut args): (&str, Vec<String>) = match self.kind {
            Kind::KernelGateway => (
                "kg",
                vec![
                    "kernelgateway".into(),
                    "--KernelGatewayApp.ip=127.0.0.1".into(),
                    format!("--KernelGatewayApp.port={}", self.port),
                    format!("--KernelGatewayApp.auth_token={TOKEN}"),
                    "--JupyterWebsocketPersonality.list_kernels=True".into(),
                ],
            ),
            Kind::EnterpriseGateway => (
                "eg",
                vec![
                    "enterprisegateway".into(),
                    "--EnterpriseGatewayApp.ip=127.0.0.1".into(),
                    format!("--EnterpriseGatewayApp.port={}", self.port),
                    format!("--EnterpriseGatewayApp.auth_token={TOKEN}"),
                    "--EnterpriseGatewayApp.list_kernels=True".into(),
                    "--EnterpriseGatewayApp.unauthorized_users=set()".into(),
                    // Its kernels' ports from a range below the ephemeral one (32768-60999):
                    // a port picked with bind(0) is closed again before the kernel binds it,
                    // and meanwhile another test's connection may take it as its source port.
                    "--EnterpriseGatewayApp.port_range=20000..29999".into(),
                ],
            ),
            Kind::JupyterServer => (
                "js",
                vec![
                    "server".into(),
                    "--allow-root".into(),
                    "--no-browser".into(),
                    "--ServerApp.ip=127.0.0.1".into(),
                    format!("--ServerApp.port={}", self.port),
                    "--ServerApp.port_retries=0".into(),
                    format!("--IdentityProvider.token={TOKEN}"),
                    format!("--ServerApp.root_dir={}", self.dir.path().display()),
                ],
            ),
        };
        if !self.rate_limited {
            args.push(match self.kind {
                Kind::EnterpriseGateway => "--EnterpriseGatewayApp.iopub_data_rate_limit=0".into(),
                _ => "--ZMQChannelsWebsocketConnection.iopub_data_rate_limit=0".into(),
            });
        }
        let bin = root().join(format!("target/test-env/jupyter/{venv}/bin/jupyter"));
        assert!(
            bin.exists(),
            "{} is missing: run `bash scripts/test-env.sh`",
            bin.display()
        );
        let jupyter = self.dir.path().join("jupyter");
        let log = std::fs::File::create(self.dir.path().join("server.log")).unwrap();
        let child = Command::new(bin)
            .args(args)
            .current_dir(self.dir.path())
            .env("JUPYTER_CONFIG_DIR", jupyter.join("config"))
            .env("JUPYTER_DATA_DIR", jupyter.join("data"))
            .env("JUPYTER_RUNTIME_DIR", jupyter.join("runtime"))
            .env("JUPYTER_PATH", jupyter.join("data"))
            .env("JUPYTER_PLATFORM_DIRS", "1")
            // Enterprise Gateway kills kernels that take longer than this to start (default
            // 30 s); a loaded 2-core machine starting many at once needs more.
            .env("EG_KERNEL_LAUNCH_TIMEOUT", "120")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn the Jupyter server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("{:?} exited early ({status}):\n{}", self.kind, self.log());
            }
            assert!(
                Instant::now() < deadline,
                "{:?} did not listen within 60 s",
                self.kind
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The server's process id (the benchmark measures its memory).
    #[allow(dead_code)]
    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The URL ipybox is given (token from `IPYBOX_GATEWAY_TOKEN` or `?token=`).
    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub(crate) fn url_with_token(&self) -> String {
        format!("http://127.0.0.1:{}/?token={TOKEN}", self.port)
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// The ids of the kernels the server runs. Asked again on a 5xx: jupyter_server's listing
    /// fails while a kernel is still starting (its model reads `last_activity`, set once the
    /// kernel runs).
    pub(crate) async fn kernels(&self) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let resp = loop {
            let resp = reqwest::Client::new()
                .get(format!("{}/api/kernels", self.url()))
                .header("Authorization", format!("token {TOKEN}"))
                .send()
                .await
                .expect("GET /api/kernels");
            if !resp.status().is_server_error() || Instant::now() > deadline {
                break resp;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            resp.status().is_success(),
            "GET /api/kernels: {}\n{}",
            resp.status(),
            self.log()
        );
        let list: Value = resp.json().await.unwrap();
        list.as_array()
            .unwrap()
            .iter()
            .map(|k| k["id"].as_str().unwrap().to_string())
            .collect()
    }

    /// Waits until the server runs exactly `n` kernels (deletes are asynchronous for some).
    pub(crate) async fn wait_kernels(&self, n: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let ks = self.kernels().await;
            if ks.len() == n || Instant::now() > deadline {
                return ks;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Asserts that the server runs no kernels (after waiting up to 15 s for deletes).
    pub(crate) async fn assert_empty(&self, what: &str) {
        assert_eq!(
            self.wait_kernels(0).await,
            Vec::<String>::new(),
            "{what}: kernels left on the server; server log:\n{}",
            self.log()
        );
    }

    /// Kills the server (SIGKILL: no chance to clean up) and its kernels.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = child.id();
            // The kernels are the server's children; kill them too, as a crashed host would.
            for child_pid in crate::proc_tree::descendants(pid) {
                unsafe { libc::kill(child_pid as i32, libc::SIGKILL) };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port.
    pub(crate) fn restart(&mut self) {
        self.kill();
        self.launch();
    }
}

impl Drop for JupyterServer {
    fn drop(&mut self) {
        self.kill();
    }
}
