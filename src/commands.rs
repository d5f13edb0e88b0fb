//! [bin] The subcommands besides `serve`: `exec`, `replay`, `apigen`, `setup` and `trust`.
//! Every one that runs code or starts MCP servers (`exec`, `replay`, `apigen`) reads its
//! workspace's `.env` as the server does ([`dotenv::WorkspaceEnv`]): the same parsing, the
//! same errors.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ipybox::CodeExecutor;
use ipybox::apigen::ApiStyle;
use ipybox::executor::{CodeExecutorBuilder, ExecutorError};
use ipybox::host_env::HostEnv;
use ipybox::pyenv::{Progress, PyEnvError};

use super::flags::units::Secs;
use super::flags::{Command, GatewayArgs, ShellArgs};
use super::{FAILURE, SUCCESS, dotenv, replay, terminal_approval, trust_command};

/// Runs a subcommand other than `serve`.
pub(crate) async fn run(command: Command) -> anyhow::Result<u8> {
    match command {
        Command::Serve { .. } => unreachable!("`serve` is dispatched by main"),
        Command::Replay {
            notebooks,
            workspace,
            python,
            timeout,
            yes,
            check,
            sandbox,
            sandbox_config,
            unsandboxed,
            shell,
            gateway,
        } => {
            let timeout = positive_timeout(timeout)?;
            let confinement = match (sandbox_config, sandbox, unsandboxed) {
                (_, _, true) => replay::Confine::Unsandboxed,
                (Some(file), _, _) => replay::Confine::Sandbox(Some(file)),
                (None, true, _) => replay::Confine::Sandbox(None),
                (None, false, false) => replay::Confine::Recorded,
            };
            let remote = gateway.kernel_gateway.is_some();
            let builder = code_builder(&workspace, python, shell, gateway)?;
            let replay = replay::Replay {
                notebooks,
                timeout,
                yes,
                check,
                confinement,
                remote,
                records: HostEnv::from_process()
                    .data_dir()
                    .map(|d| d.join(ipybox::notebook::ledger::RECORDS_DIR)),
            };
            replay::run(replay, builder).await
        }
        Command::Trust { paths, yes, list } => {
            let mode = match (yes, list) {
                (true, _) => trust_command::Mode::Yes,
                (_, true) => trust_command::Mode::List,
                _ => trust_command::Mode::Ask,
            };
            trust_command::run(&paths, mode)
        }
        Command::Setup { python } => setup(python).await,
        Command::Apigen {
            name,
            params,
            root,
            workspace,
            async_api,
        } => apigen(&name, &params, &workspace, &root, async_api).await,
        Command::Exec {
            workspace,
            python,
            timeout,
            yes,
            sandbox,
            sandbox_config,
            shell,
            gateway,
            code,
            file,
        } => {
            let (code, name) = read_code(code, file)?;
            let timeout = positive_timeout(timeout)?;
            if sandbox && gateway.kernel_gateway.is_some() {
                anyhow::bail!(
                    "--sandbox wraps local kernel processes; it cannot apply to kernels on a Jupyter server (--kernel-gateway)\n  help: use one of the two (isolate remote kernels on the server side, e.g. one pod per kernel)"
                );
            }
            let mut builder =
                code_builder(&workspace, python, shell, gateway)?.without_spare_kernel();
            if sandbox {
                builder = builder.sandbox(ipybox::sandbox::SandboxOptions {
                    config_file: sandbox_config,
                    ..Default::default()
                });
            }
            exec(builder, &code, name.as_deref(), timeout, yes).await
        }
    }
}

/// `--timeout` of `exec` and `replay`: a positive duration.
fn positive_timeout(timeout: Option<Secs>) -> anyhow::Result<Option<Duration>> {
    timeout
        .map(|t| t.positive("--timeout", ""))
        .transpose()
        .map_err(anyhow::Error::msg)
}

/// The workspace of a command that runs code: it must exist (a typo is not created).
pub(crate) fn existing_workspace(dir: &Path) -> anyhow::Result<PathBuf> {
    if !dir.is_dir() {
        let what = if dir.exists() {
            "is not a directory"
        } else {
            "does not exist"
        };
        anyhow::bail!(
            "the workspace {} {what}\n  help: pass an existing directory as --workspace (create it first: mkdir -p {})",
            dir.display(),
            dir.display()
        );
    }
    Ok(ipybox::executor::resolve_workspace(Some(dir))?)
}

/// An executor for `exec` and `replay`: the workspace (which must exist), its `.env` (as the
/// server reads it), the interpreter or gateway, shell approval, progress on stderr.
fn code_builder(
    workspace: &Path,
    python: Option<PathBuf>,
    shell: ShellArgs,
    gateway: GatewayArgs,
) -> anyhow::Result<CodeExecutorBuilder> {
    let workspace = existing_workspace(workspace)?;
    let host = HostEnv::from_process();
    let env = dotenv::WorkspaceEnv::load(&workspace, host.vars().clone())?;
    let builder = shell.apply(
        CodeExecutor::builder()
            .workspace(workspace)
            .host_env(host)
            .kernel_env(env.kernel_env)
            .tool_env(env.tool_env)
            .progress(print_progress())
            .approval_text_limit(ipybox::tools::shown::HUMAN_TEXT_LIMIT),
    );
    Ok(gateway.apply(builder, python))
}

/// `ipybox exec`: runs `code` (from the file `name`, if any) and prints what it prints.
async fn exec(
    builder: CodeExecutorBuilder,
    code: &str,
    name: Option<&str>,
    timeout: Option<Duration>,
    yes: bool,
) -> anyhow::Result<u8> {
    let executor = builder.build();
    // Before anything runs: no sandbox here is a refusal, never a kernel on the host.
    if let Err(e) = executor.check_sandbox().await {
        anyhow::bail!(
            "cannot run the code in the sandbox: {e}\n  help: make the sandbox available here (docs/sandbox.md, Requirements), or leave out --sandbox to run the code on this host, unsandboxed"
        );
    }
    executor.start().await.map_err(|e| match e {
        ExecutorError::PythonEnv(e) => with_cli_help(e),
        other => anyhow::Error::new(other),
    })?;
    let execution = executor.stream(code, timeout);
    let mut approver = terminal_approval::TerminalApprover::new(yes);
    let result = terminal_approval::print_execution(execution, &mut approver).await;
    executor.stop().await;
    match result?.context("the execution ended without a result")? {
        Ok(_) => Ok(SUCCESS),
        Err(e) => {
            let text = e.to_string();
            // The kernel is stopped right after: nothing of its state is kept.
            let text = text.replace(
                "; kernel state was kept",
                " (ipybox exec stops the kernel: nothing is kept)",
            );
            eprintln!("{}", name.map_or(text.clone(), |n| in_file(&text, n)));
            Ok(FAILURE)
        }
    }
}

/// A traceback of `exec FILE` names the file, not the kernel's cell (`Cell In[1], line 3` is
/// `File "job.py", line 3`: the cell is the whole file, its lines the file's).
fn in_file(traceback: &str, file: &str) -> String {
    traceback
        .lines()
        .map(|line| {
            let indent = &line[..line.len() - line.trim_start().len()];
            let cell = line.trim_start().strip_prefix("Cell In[");
            match cell.and_then(|rest| rest.split_once("], line ")) {
                Some((_, at)) => format!("{indent}File \"{file}\", line {at}"),
                None => line.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `ipybox apigen`: `${VAR}` in the params from the environment or the workspace's `.env`.
async fn apigen(
    name: &str,
    params: &str,
    workspace: &Path,
    root: &Path,
    async_api: bool,
) -> anyhow::Result<u8> {
    let params: serde_json::Value = serde_json::from_str(params).map_err(|e| {
        anyhow::anyhow!(
            "--params is not valid JSON ({e})\n  help: pass e.g. --params '{{\"command\": \"npx\", \"args\": [\"-y\", \"@modelcontextprotocol/server-memory\"]}}'"
        )
    })?;
    let style = if async_api {
        ApiStyle::Async
    } else {
        ApiStyle::Sync
    };
    let workspace = existing_workspace(workspace)?;
    let host = HostEnv::from_process();
    let env = dotenv::WorkspaceEnv::load(&workspace, host.vars().clone())?;
    let root = workspace.join(root);
    let modules = ipybox::generate_mcp_sources_with(
        name,
        &params,
        &root,
        &env.tool_env,
        ipybox::tools::DEFAULT_CONNECT_TIMEOUT,
        style,
    )
    .await?;
    eprintln!(
        "generated {} modules in {}",
        modules.len(),
        root.join(name).display()
    );
    for m in modules {
        println!("{m}");
    }
    Ok(SUCCESS)
}

/// `ipybox setup`: the kernel's environment, made or checked.
async fn setup(python: Option<PathBuf>) -> anyhow::Result<u8> {
    let host = HostEnv::from_process();
    let env = tokio::task::spawn_blocking(move || {
        ipybox::pyenv::resolve(python.as_deref(), &host, &print_progress())
    })
    .await?
    .map_err(with_cli_help)?;
    match &env.managed_dir {
        Some(dir) => println!(
            "kernel environment: {}\npython: {}",
            dir.display(),
            env.python.display()
        ),
        None => println!(
            "python: {} (has ipykernel and pydantic)",
            env.python.display()
        ),
    }
    Ok(SUCCESS)
}

/// Provisioning progress on stderr, as `ipybox: <line>`.
fn print_progress() -> Progress {
    Arc::new(|line: &str| eprintln!("ipybox: {line}"))
}

/// Adds where the interpreter comes from on the command line to errors about it.
fn with_cli_help(e: PyEnvError) -> anyhow::Error {
    let hint = matches!(
        e,
        PyEnvError::NotRunnable { .. } | PyEnvError::MissingPackages { .. }
    )
    .then_some("\n  help: the interpreter comes from --python PATH or IPYBOX_PYTHON");
    anyhow::anyhow!("{e}{}", hint.unwrap_or(""))
}

/// The code of `exec`, and the file's name when it came from one.
fn read_code(
    code: Option<String>,
    file: Option<PathBuf>,
) -> anyhow::Result<(String, Option<String>)> {
    match (code, file) {
        (Some(code), _) => Ok((code, None)),
        (None, Some(f)) if f.as_os_str() == "-" => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading code from stdin")?;
            Ok((s, None))
        }
        (None, Some(f)) => std::fs::read_to_string(&f)
            .with_context(|| format!("reading {}", f.display()))
            .map(|code| (code, Some(f.display().to_string()))),
        (None, None) => {
            anyhow::bail!("no code given\n  help: pass -c CODE, a FILE, or - to read stdin")
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_file_traceback_names_the_file() {
        assert_eq!(
            super::in_file(
                "Traceback (most recent call last):\n  Cell In[1], line 3, in f\nCell In[1], line 5\n    1/0\nZeroDivisionError: division by zero",
                "job.py"
            ),
            "Traceback (most recent call last):\n  File \"job.py\", line 3, in f\nFile \"job.py\", line 5\n    1/0\nZeroDivisionError: division by zero"
        );
    }
}
