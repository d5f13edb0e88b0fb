//! The `ipybox` binary: human-facing subcommands (and, with the MCP server issue, the MCP server).
//!
//! stdout carries program output only (and, for the MCP server, the protocol); logs go to stderr.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use ipybox::CodeExecutor;
use ipybox::executor::ExecutionEvent;

#[derive(Parser, Debug)]
#[command(
    name = "ipybox",
    version,
    about = "Code-execution sandbox for agents that act by writing Python"
)]
#[command(arg_required_else_help = true)]
struct Cli {
    /// Log level for stderr logs (error, warn, info, debug, trace); IPYBOX_LOG overrides.
    #[arg(long, global = true, default_value = "warn")]
    log_level: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run Python code in a fresh kernel and print its output.
    ///
    /// Exits 1 with the traceback on stderr when the code fails.
    Exec {
        /// Kernel working directory (created if missing).
        #[arg(long, default_value = ".")]
        workspace: PathBuf,
        /// Python interpreter with ipykernel and pydantic (default: the managed environment).
        #[arg(long, env = "IPYBOX_PYTHON")]
        python: Option<PathBuf>,
        /// Give up (interrupt) after this many seconds.
        #[arg(long)]
        timeout: Option<f64>,
        /// Code to run.
        #[arg(short = 'c', long = "code", conflicts_with = "file")]
        code: Option<String>,
        /// File with code to run, or `-` for stdin.
        file: Option<PathBuf>,
    },
    /// Create (or check) the kernel's Python environment and print where it is.
    Setup {
        /// Check this interpreter instead of the managed environment.
        #[arg(long, env = "IPYBOX_PYTHON")]
        python: Option<PathBuf>,
    },
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("IPYBOX_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("ipybox={level},warn")));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log_level);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Setup { python } => {
            let env =
                tokio::task::spawn_blocking(move || ipybox::pyenv::resolve(python.as_deref()))
                    .await??;
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
            Ok(ExitCode::SUCCESS)
        }
        Command::Exec {
            workspace,
            python,
            timeout,
            code,
            file,
        } => {
            let code = read_code(code, file)?;
            let mut builder = CodeExecutor::builder()
                .workspace(workspace)
                .without_spare_kernel();
            if let Some(p) = python {
                builder = builder.python(p);
            }
            let executor = builder.build();
            executor.start().await?;
            let timeout = timeout.map(Duration::from_secs_f64);
            let mut execution = executor.stream(&code, timeout);
            let mut stdout = std::io::stdout();
            let mut result = None;
            let mut needs_newline = false;
            while let Some(event) = execution.next().await {
                match event {
                    ExecutionEvent::Chunk(text) => {
                        stdout.write_all(text.as_bytes())?;
                        stdout.flush()?;
                        needs_newline = !text.ends_with('\n');
                    }
                    ExecutionEvent::Image(path) => writeln!(stdout, "[image: {}]", path.display())?,
                    ExecutionEvent::Result(r) => result = Some(r),
                }
            }
            executor.stop().await;
            if needs_newline {
                writeln!(stdout)?;
            }
            match result.context("the execution ended without a result")? {
                Ok(_) => Ok(ExitCode::SUCCESS),
                Err(e) => {
                    eprintln!("{e}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
    }
}

fn read_code(code: Option<String>, file: Option<PathBuf>) -> anyhow::Result<String> {
    match (code, file) {
        (Some(code), _) => Ok(code),
        (None, Some(f)) if f.as_os_str() == "-" => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading code from stdin")?;
            Ok(s)
        }
        (None, Some(f)) => {
            std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))
        }
        (None, None) => {
            anyhow::bail!("no code given\n  help: pass -c CODE, a FILE, or - to read stdin")
        }
    }
}
