//! [bin] `ipybox replay NOTEBOOK...`: runs a recorded session's code cells again in a fresh
//! kernel, in order, printing their outputs as `ipybox exec` does (tool calls and shell commands
//! are asked about again on the terminal, or accepted with `--yes`), resetting the kernel where
//! the recording did (a reset, a replaced kernel), and says which cells' outputs differ from
//! the recording. With `--check` a difference is an exit status of 1.
//!
//! Each replayed cell is recorded in a notebook kept in memory, by the same code that recorded
//! the original, so both sides are compared in the same terms (`ipybox::notebook::read`). Not
//! here: reading notebooks and comparing outputs (the library), terminal prompts
//! ([`super::terminal_approval`]).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use ipybox::executor::{CodeExecutorBuilder, ExecutorError, RunOptions};
use ipybox::notebook::NotebookConfig;
use ipybox::notebook::read::{self, Entry};

use super::terminal_approval::{TerminalApprover, print_execution};

/// What `ipybox replay` is told besides the executor's flags.
pub(crate) struct Replay {
    pub(crate) notebooks: Vec<PathBuf>,
    /// Overrides each cell's recorded timeout.
    pub(crate) timeout: Option<Duration>,
    pub(crate) yes: bool,
    pub(crate) check: bool,
}

/// Runs the replay on an executor made from `builder`; returns the exit status.
pub(crate) async fn run(replay: Replay, builder: CodeExecutorBuilder) -> anyhow::Result<u8> {
    let mut entries = Vec::new();
    for path in &replay.notebooks {
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let parsed =
            read::parse(&bytes).with_context(|| format!("cannot replay {}", path.display()))?;
        entries.extend(parsed);
    }
    let total = entries
        .iter()
        .filter(|e| matches!(e, Entry::Code(_)))
        .count();
    if total == 0 {
        eprintln!("ipybox replay: no code cells to replay");
        return Ok(0);
    }
    let resets = entries.iter().any(|e| matches!(e, Entry::Section(_)));
    let executor = builder
        .spare_kernels(usize::from(resets))
        .notebook_config(NotebookConfig::in_memory())
        .build();
    executor.start().await?;
    let mut approver = TerminalApprover::new(replay.yes);
    let mut differing = Vec::new();
    let mut ran_since_reset = false;
    let mut replayed = 0;
    for entry in entries {
        match entry {
            Entry::Section(why) => {
                if ran_since_reset {
                    eprintln!(
                        "ipybox replay: the kernel is reset here, as it was in the recording ({why})"
                    );
                    executor.reset().await?;
                    ran_since_reset = false;
                }
            }
            Entry::Installed(spec) => eprintln!(
                "ipybox replay: the recorded session installed {spec:?} here; replay installs nothing (install it first if the cells below need it)"
            ),
            Entry::Code(cell) => {
                replayed += 1;
                ran_since_reset = true;
                let first = cell.source.lines().next().unwrap_or_default();
                eprintln!(
                    "ipybox replay: cell {}/{total}: {}",
                    cell.number,
                    ipybox::tools::shorten(first, 80)
                );
                let options = RunOptions {
                    timeout: replay.timeout.or(cell.timeout),
                    accept_all: false,
                    notebook_output_chars: cell.output_limit,
                    ..RunOptions::default()
                };
                let execution = executor.stream_with_options(&cell.source, options);
                match print_execution(execution, &mut approver).await? {
                    Some(Ok(_)) => {}
                    Some(Err(ExecutorError::Kernel(ipybox::kernel::KernelError::Stopped)))
                    | None => anyhow::bail!("the kernel stopped during cell {}", cell.number),
                    Some(Err(e)) => eprintln!("{}", e.error_text()),
                }
                let now = executor
                    .notebook()
                    .and_then(|n| n.last_code_cell())
                    .map(|c| read::outputs(&c))
                    .unwrap_or_default();
                let differences = cell.outputs.differences(&now);
                if !differences.is_empty() {
                    differing.push((cell.number, differences));
                }
            }
        }
    }
    executor.stop().await;
    if differing.is_empty() {
        eprintln!("ipybox replay: {replayed} cells replayed, every output as recorded");
        return Ok(0);
    }
    eprintln!(
        "ipybox replay: {} of {replayed} cells differ from the recording:",
        differing.len()
    );
    for (number, lines) in &differing {
        for line in lines {
            eprintln!("  cell {number}: {line}");
        }
    }
    Ok(if replay.check { 1 } else { 0 })
}
