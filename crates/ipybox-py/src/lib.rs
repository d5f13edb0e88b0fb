//! `ipybox._ipybox`: the extension module of the `ipybox-rs` wheel.
//!
//! A thin layer over the Rust library: an executor whose futures run on a tokio runtime and
//! are awaited from asyncio (pyo3-async-runtimes), a stream of execution items as plain tuples,
//! approval handles, `generate_mcp_sources`, and the whole `ipybox` command line (the root
//! crate's `src/main.rs`, compiled in here as well). The Python-facing API of Python ipybox
//! (`CodeExecutor`, `ApprovalRequest`, exceptions, ...) is written in Python on top of this, in
//! `python/ipybox/`.
//!
//! Not here: any behaviour of its own. Timeouts, approvals, cancellation and output handling
//! are the library's.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use ipybox::CodeExecutor;
use ipybox::apigen::ApiStyle;
use ipybox::executor::{Canceller, Execution, ExecutionEvent, ExecutorError};
use ipybox::kernel::KernelError;
use ipybox::sandbox::SandboxOptions;
use ipybox::tools::ApprovalRequest;

// The binary's command line; its `fn main` is the binary's alone.
#[allow(dead_code, unreachable_pub)]
#[path = "../../../src/main.rs"]
mod cli;

fn runtime_error(e: impl std::fmt::Display) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

fn secs(value: f64, what: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        PyValueError::new_err(format!(
            "{what} must be a non-negative number of seconds, got {value}"
        ))
    })
}

/// One `CodeExecutor` of the Rust library.
#[pyclass(frozen, module = "ipybox._ipybox")]
struct Executor {
    inner: CodeExecutor,
}

#[pymethods]
impl Executor {
    #[new]
    #[pyo3(signature = (*, python, working_dir, restore_working_dir, images_dir, kernel_env, approval_timeout, connect_timeout, kernel_start_timeout, sandbox, sandbox_config, spare_kernels, approve_shell_cmds, require_shell_escape, kernel_gateway=None, notebook_dir=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        python: PathBuf,
        working_dir: PathBuf,
        restore_working_dir: bool,
        images_dir: PathBuf,
        kernel_env: HashMap<String, String>,
        approval_timeout: Option<f64>,
        connect_timeout: f64,
        kernel_start_timeout: f64,
        sandbox: bool,
        sandbox_config: Option<PathBuf>,
        spare_kernels: usize,
        approve_shell_cmds: bool,
        require_shell_escape: bool,
        kernel_gateway: Option<String>,
        notebook_dir: Option<PathBuf>,
    ) -> PyResult<Self> {
        let approval_timeout = match approval_timeout {
            Some(t) => secs(t, "approval_timeout")?,
            None => Duration::MAX,
        };
        let mut builder = match kernel_gateway {
            // Kernels on a Jupyter server use its kernelspec's Python.
            Some(url) => CodeExecutor::builder().kernel_gateway(url),
            None => CodeExecutor::builder().python(python),
        };
        builder = builder
            .workspace(working_dir)
            .restore_working_dir(restore_working_dir)
            .images_dir(images_dir)
            .kernel_env(kernel_env)
            .approval_timeout(approval_timeout)
            .connect_timeout(secs(connect_timeout, "connect_timeout")?)
            .kernel_start_timeout(secs(kernel_start_timeout, "kernel_init_timeout")?)
            .spare_kernels(spare_kernels)
            .approve_shell_cmds(approve_shell_cmds)
            .require_shell_escape(require_shell_escape);
        if let Some(dir) = notebook_dir {
            builder = builder.notebook(dir);
        }
        if sandbox {
            builder = builder.sandbox(SandboxOptions {
                config_file: sandbox_config,
                ..Default::default()
            });
        }
        Ok(Self {
            inner: builder.build(),
        })
    }

    fn start<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let ex = self.inner.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            ex.start().await.map_err(runtime_error)
        })
    }

    fn stop<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let ex = self.inner.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            ex.stop().await;
            Ok(())
        })
    }

    fn reset<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let ex = self.inner.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            ex.reset().await.map_err(runtime_error)
        })
    }

    /// Starts an execution; `auto_accept` accepts its tool calls here, without a round trip
    /// through Python, `accept_shell` its shell commands (`approve_shell_cmds`); without `chunks`
    /// output arrives only with the result (one hop fewer per chunk).
    #[pyo3(signature = (code, timeout, auto_accept, accept_shell, chunks))]
    fn stream(
        &self,
        code: &str,
        timeout: Option<f64>,
        auto_accept: bool,
        accept_shell: bool,
        chunks: bool,
    ) -> PyResult<Stream> {
        let timeout = timeout.map(|t| secs(t, "timeout")).transpose()?;
        let _runtime = pyo3_async_runtimes::tokio::get_runtime().enter();
        let execution = self.inner.stream(code, timeout);
        Ok(Stream {
            canceller: execution.canceller(),
            execution: Arc::new(tokio::sync::Mutex::new(execution)),
            auto_accept,
            accept_shell,
            chunks,
        })
    }

    fn kernel_pid<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let ex = self.inner.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move { Ok(ex.kernel_pid().await) })
    }

    /// The session notebook's file, if one is recorded.
    fn notebook_path(&self) -> Option<PathBuf> {
        self.inner.notebook().and_then(|n| n.path())
    }
}

/// The items of one execution, as tuples:
/// `("chunk", text)`, `("image", path)` (only when asked for), `("approval", Approval)`, `("result", text, [paths])`,
/// `("cancelled",)`, `("error", kind, message, output)` with kind `failed`, `timeout`, `died`,
/// `stopped` or `other`.
#[pyclass(frozen, module = "ipybox._ipybox")]
struct Stream {
    execution: Arc<tokio::sync::Mutex<Execution>>,
    canceller: Canceller,
    auto_accept: bool,
    accept_shell: bool,
    chunks: bool,
}

enum Item {
    Chunk(String),
    Image(PathBuf),
    Approval(ApprovalRequest),
    Done(Result<ipybox::executor::ExecutionResult, ExecutorError>),
    End,
}

#[pymethods]
impl Stream {
    /// The next item; `None` after the last.
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let execution = self.execution.clone();
        let (auto_accept, accept_shell) = (self.auto_accept, self.accept_shell);
        let chunks = self.chunks;
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let item = {
                let mut execution = execution.lock().await;
                loop {
                    match execution.next().await {
                        Some(ExecutionEvent::Chunk(text)) if chunks => break Item::Chunk(text),
                        Some(ExecutionEvent::Image(path)) if chunks => break Item::Image(path),
                        Some(ExecutionEvent::Chunk(_) | ExecutionEvent::Image(_)) => {}
                        Some(ExecutionEvent::Approval(request))
                            if (request.is_shell_command() && accept_shell)
                                || (!request.is_shell_command() && auto_accept) =>
                        {
                            request.accept_unasked()
                        }
                        Some(ExecutionEvent::Approval(request)) => break Item::Approval(request),
                        Some(ExecutionEvent::Result(result)) => break Item::Done(result),
                        None => break Item::End,
                    }
                }
            };
            Python::attach(|py| to_python(py, item))
        })
    }

    /// Interrupts the execution; `next()` then ends with `("cancelled",)`. Safe to call at any
    /// time, from any thread.
    fn cancel(&self) {
        self.canceller.cancel();
    }
}

fn to_python(py: Python<'_>, item: Item) -> PyResult<Py<PyAny>> {
    let any = |b: Bound<'_, pyo3::types::PyTuple>| b.into_any().unbind();
    Ok(match item {
        Item::Chunk(text) => any(("chunk", text).into_pyobject(py)?),
        Item::Image(path) => any(("image", path).into_pyobject(py)?),
        Item::Approval(request) => {
            let arguments = serde_json::Value::Object(request.arguments.clone()).to_string();
            let approval = Approval {
                server_name: request.server_name.clone(),
                tool_name: request.tool_name.clone(),
                arguments,
                shell: request.is_shell_command(),
                calls: request.calls(),
                server_command: request.server_command.clone(),
                request: std::sync::Mutex::new(Some(request)),
            };
            any(("approval", Py::new(py, approval)?).into_pyobject(py)?)
        }
        Item::Done(Ok(result)) => any(("result", result.text, result.images).into_pyobject(py)?),
        Item::Done(Err(ExecutorError::Cancelled)) => any(("cancelled",).into_pyobject(py)?),
        Item::Done(Err(e)) => {
            let kind = match &e {
                ExecutorError::Kernel(KernelError::Failed { .. }) => "failed",
                ExecutorError::Kernel(KernelError::Timeout { .. }) => "timeout",
                ExecutorError::Kernel(KernelError::Died { .. }) => "died",
                ExecutorError::Kernel(KernelError::Stopped) => "stopped",
                _ => "other",
            };
            let message = match &e {
                ExecutorError::Kernel(KernelError::Failed {
                    ename,
                    evalue,
                    traceback,
                    ..
                }) => format!("{ename}: {evalue}\n{traceback}"),
                other => other.to_string(),
            };
            any(("error", kind, message, e.output().to_string()).into_pyobject(py)?)
        }
        Item::End => py.None(),
    })
}

/// A tool call waiting for a decision. Deciding twice does nothing the second time.
#[pyclass(frozen, module = "ipybox._ipybox")]
struct Approval {
    #[pyo3(get)]
    server_name: String,
    #[pyo3(get)]
    tool_name: String,
    /// The arguments as a JSON object.
    #[pyo3(get)]
    arguments: String,
    /// Whether this is a shell command (`approve_shell_cmds`), not a tool call.
    #[pyo3(get)]
    shell: bool,
    /// How many identical calls the decision answers (queued duplicates are asked once).
    #[pyo3(get)]
    calls: usize,
    /// The registered server's command line or URL (None for shell commands).
    #[pyo3(get)]
    server_command: Option<String>,
    request: std::sync::Mutex<Option<ApprovalRequest>>,
}

#[pymethods]
impl Approval {
    /// Lets the call go ahead; False if it was already decided.
    fn accept(&self) -> bool {
        self.take().map(ApprovalRequest::accept).is_some()
    }

    /// Fails the call in the kernel with `ApprovalRejectedError`; False if it was already decided.
    fn reject(&self) -> bool {
        self.take().map(ApprovalRequest::reject).is_some()
    }
}

impl Approval {
    fn take(&self) -> Option<ApprovalRequest> {
        self.request
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

/// `str(request)`: the request as every ipybox prompt shows it (`ipybox::tools::shown`), values
/// as Python literals: `server.tool(a=1, name='x')`, names and strings escaped, nothing cut.
#[pyfunction]
#[pyo3(signature = (server_name, tool_name, arguments, shell=false, calls=1))]
fn describe(
    server_name: &str,
    tool_name: &str,
    arguments: &str,
    shell: bool,
    calls: usize,
) -> PyResult<String> {
    let arguments: serde_json::Value = serde_json::from_str(arguments)
        .map_err(|e| PyValueError::new_err(format!("tool_args is not JSON: {e}")))?;
    let request = if shell {
        let cmd = arguments
            .get("cmd")
            .and_then(|c| c.as_str())
            .unwrap_or_default();
        let magic = arguments.get("magic").and_then(|m| m.as_str());
        ipybox::tools::testing::shell(cmd, magic)
    } else {
        ipybox::tools::testing::tool_call(server_name, tool_name, arguments)
    };
    let text = request.describe_as(ipybox::tools::shown::Syntax::Python);
    Ok(match calls {
        0 | 1 => text,
        n => format!("{text} [{n} identical calls]"),
    })
}

/// Generates `<root_dir>/<server_name>/` for the server at `params` (a JSON object).
#[pyfunction]
#[pyo3(signature = (server_name, params, root_dir, async_api))]
fn generate_mcp_sources<'py>(
    py: Python<'py>,
    server_name: String,
    params: &str,
    root_dir: PathBuf,
    async_api: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let params: serde_json::Value = serde_json::from_str(params)
        .map_err(|e| PyValueError::new_err(format!("server_params is not JSON: {e}")))?;
    let style = if async_api {
        ApiStyle::Async
    } else {
        ApiStyle::Sync
    };
    // `${VAR}` placeholders resolve from the environment as it is now (os.environ included).
    let env = ipybox::host_env::HostEnv::from_process().vars().clone();
    pyo3_async_runtimes::tokio::future_into_py(py, async move {
        ipybox::generate_mcp_sources_with(
            &server_name,
            &params,
            &root_dir,
            &env,
            ipybox::tools::DEFAULT_CONNECT_TIMEOUT,
            style,
        )
        .await
        .map_err(runtime_error)
    })
}

/// Records the server for `root_dir`, whose package another generator (mcpygen) wrote.
#[pyfunction]
fn register_generated(server_name: &str, params: &str, root_dir: PathBuf) -> PyResult<()> {
    let params: serde_json::Value = serde_json::from_str(params)
        .map_err(|e| PyValueError::new_err(format!("server_params is not JSON: {e}")))?;
    let env = ipybox::host_env::HostEnv::from_process().vars().clone();
    ipybox::register_generated(server_name, &params, &root_dir, &env).map_err(runtime_error)
}

/// Logs of the library to stderr at `level` (error, warn, info, debug, trace), once per process;
/// `IPYBOX_LOG` (an env-filter directive) overrides. The CLI's own setup.
#[pyfunction]
fn init_logging(level: &str) {
    cli::init_logging(level);
}

/// Runs the `ipybox` command line with `argv` (program name first) and returns its exit status.
#[pyfunction]
fn run_cli(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(|| cli::cli_main(argv))
}

#[pymodule]
fn _ipybox(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Executor>()?;
    m.add_class::<Stream>()?;
    m.add_class::<Approval>()?;
    m.add_function(wrap_pyfunction!(generate_mcp_sources, m)?)?;
    m.add_function(wrap_pyfunction!(describe, m)?)?;
    m.add_function(wrap_pyfunction!(register_generated, m)?)?;
    m.add_function(wrap_pyfunction!(init_logging, m)?)?;
    m.add_function(wrap_pyfunction!(run_cli, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
