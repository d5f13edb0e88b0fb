//! [bin] `ipybox replay NOTEBOOK...`: runs a recorded session's code cells again in a fresh
//! kernel, in order, printing their outputs as `ipybox exec` does (tool calls and shell commands
//! are asked about again on the terminal, or accepted with `--yes`), resetting the kernel where
//! the recording did (a reset, a replaced kernel), and says which cells' outputs differ from
//! the recording. With `--check` a difference is an exit status of 1.
//!
//! Each replayed cell is recorded in a notebook kept in memory, by the same code that recorded
//! the original, so both sides are compared in the same terms (`ipybox::notebook::read`).
//!
//! What ran in a sandbox replays in it: before anything runs, each notebook is checked against
//! the host's own record of it (`ipybox::notebook::ledger`), and one whose code cells differ
//! from what ran (changed, inserted, removed) is refused; the replay then runs under the
//! recorded confinement (a session recorded with `--sandbox` replays sandboxed, with the
//! recorded policy, and says so), or fails when the sandbox cannot run here. Only
//! `--unsandboxed` runs such a session on the host. A notebook without a host record (from
//! another machine, a copy, or one a sandboxed kernel wrote into the workspace) never chooses
//! its own confinement: whatever its metadata says, it replays in the sandbox under the default
//! policy (or `--sandbox-config`), or not at all; `--unsandboxed` runs it on the host and says
//! so before the first cell (issue 50).
//!
//! Not here: reading notebooks, host records and comparing outputs (the library), terminal
//! prompts ([`super::terminal_approval`]).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use ipybox::executor::{CodeExecutorBuilder, ExecutorError, RunOptions};
use ipybox::notebook::NotebookConfig;
use ipybox::notebook::ledger::{self, Confinement};
use ipybox::notebook::read::{self, Entry};
use ipybox::sandbox::{SandboxOptions, SandboxPolicy};

use super::terminal_approval::{TerminalApprover, print_execution};

/// What `ipybox replay` is told besides the executor's flags.
pub(crate) struct Replay {
    pub(crate) notebooks: Vec<PathBuf>,
    /// Overrides each cell's recorded timeout.
    pub(crate) timeout: Option<Duration>,
    pub(crate) yes: bool,
    pub(crate) check: bool,
    /// How confined the replay runs.
    pub(crate) confinement: Confine,
    /// The kernels run on a Jupyter server (`--kernel-gateway`).
    pub(crate) remote: bool,
    /// The host records (`<data dir>/notebook-records`), if ipybox has a data directory.
    pub(crate) records: Option<PathBuf>,
}

/// How confined a replay runs, as asked.
pub(crate) enum Confine {
    /// As recorded (the default).
    Recorded,
    /// In the sandbox: under this settings file, else the recorded policy, else the default.
    Sandbox(Option<PathBuf>),
    /// Without the sandbox, whatever was recorded (`--unsandboxed`).
    Unsandboxed,
}

/// A notebook read: its path, bytes, JSON and entries.
type Read = (PathBuf, Vec<u8>, serde_json::Value, Vec<Entry>);

/// Says what of `path`'s cells besides their code is not what the host wrote (`check`): the
/// replay goes on (it runs the code, which is as recorded) but a person reading the file
/// should know.
fn warn_edited(path: &std::path::Path, json: &serde_json::Value, check: ledger::CellsCheck) {
    let name = path.display();
    match check {
        ledger::CellsCheck::Same => {}
        ledger::CellsCheck::Differ(positions) => {
            let cells = json["cells"].as_array().map(Vec::as_slice).unwrap_or(&[]);
            for at in positions {
                let code_number = cells[..at.min(cells.len())]
                    .iter()
                    .filter(|c| c["cell_type"] == "code")
                    .count();
                let what = match cells.get(at - 1) {
                    Some(c) if c["cell_type"] == "code" => format!(
                        "cell {code_number}'s outputs or metadata (tool calls, approvals) differ"
                    ),
                    _ if code_number == 0 => "a note before cell 1 differs".to_string(),
                    _ => format!("a note after cell {code_number} differs"),
                };
                eprintln!(
                    "ipybox replay: warning: {name} was edited after the session: {what} from what the host wrote"
                );
            }
        }
        ledger::CellsCheck::Count { recorded, file } => eprintln!(
            "ipybox replay: warning: {name} was edited after the session: it has {file} cells where the host wrote {recorded} (a note added or removed)"
        ),
        ledger::CellsCheck::Unknown => eprintln!(
            "ipybox replay: {name} was saved by another program since the host wrote it: only its code was checked against the host's record"
        ),
    }
}

/// How the recording was confined, as [`check_notebooks`] found it.
struct Recorded {
    /// The most confined of the confinements the host's records name, if any.
    confinement: Option<Confinement>,
    /// The notebooks without a host record: they replay in the sandbox under the default policy
    /// (or `--sandbox-config`), whatever their metadata says, unless `--unsandboxed`.
    unrecorded: Vec<PathBuf>,
}

/// Why nothing may run: the lines to print, and the help.
type Refusal = (Vec<String>, &'static str);

/// Checks each notebook against the host's record of it and returns how the recording was
/// confined, or why nothing may run.
fn check_notebooks(
    replay: &Replay,
    notebooks: &[Read],
) -> anyhow::Result<Result<Recorded, Refusal>> {
    let mut refused = Vec::new();
    let mut policies_differ = false;
    let mut unrecorded = Vec::new();
    let mut sandboxed: Option<(Confinement, &PathBuf)> = None;
    let mut plain = None;
    for (path, bytes, json, entries) in notebooks {
        let record = match &replay.records {
            Some(dir) => ledger::lookup(dir, path)?,
            None => None,
        };
        let in_metadata = Confinement::from_metadata(json);
        let confinement = match &record {
            Some(record) => {
                let sources: Vec<&str> = entries
                    .iter()
                    .filter_map(|e| match e {
                        Entry::Code(cell) => Some(cell.source.as_str()),
                        _ => None,
                    })
                    .collect();
                let lines = ledger::compare(&record.code_cells, &sources);
                if !lines.is_empty() {
                    refused.push(format!(
                        "{} is not what ran: its code cells differ from the host's record of the session:",
                        path.display()
                    ));
                    refused.extend(lines.into_iter().map(|l| format!("  {l}")));
                } else {
                    warn_edited(path, json, ledger::check_cells(&record.cells, bytes));
                }
                if in_metadata.is_some() && in_metadata != record.confinement {
                    refused.push(format!(
                        "{} is not what ran: its recorded confinement differs from the host's record of the session",
                        path.display()
                    ));
                }
                record.confinement.clone()
            }
            None => {
                // Its metadata is whatever wrote the file said, a sandboxed kernel included:
                // named, never applied.
                let claim = match &in_metadata {
                    Some(c) if c.sandbox => ", and the confinement its metadata names (a sandbox, under the policy written there) is not trusted".to_string(),
                    Some(c) => format!(
                        ", and the confinement its metadata names ({}) is not trusted",
                        c.describe()
                    ),
                    None => String::new(),
                };
                eprintln!(
                    "ipybox replay: no host record of {} (a copy, a notebook from another machine, or one a kernel wrote): its cells cannot be checked against what ran{claim}",
                    path.display()
                );
                unrecorded.push(path.clone());
                None
            }
        };
        match confinement {
            Some(c) if c.sandbox => match &sandboxed {
                Some((first, at))
                    if first.policy_sha256 != c.policy_sha256
                        && !matches!(replay.confinement, Confine::Sandbox(Some(_))) =>
                {
                    policies_differ = true;
                    refused.push(format!(
                        "{} and {} were recorded in sandboxes with different policies",
                        at.display(),
                        path.display()
                    ));
                }
                Some(_) => {}
                None => sandboxed = Some((c, path)),
            },
            Some(c) => plain = plain.or(Some(c)),
            None => {}
        }
    }
    // A notebook without a record replays under the default policy: with a recorded one that
    // differs, no one policy is both (the person chooses it).
    let default_digest =
        Confinement::sandboxed(&SandboxPolicy::default_policy(), None).policy_sha256;
    if let (Some(without), Some((recorded, at))) = (unrecorded.first(), &sandboxed)
        && recorded.policy_sha256 != default_digest
        && matches!(
            replay.confinement,
            Confine::Recorded | Confine::Sandbox(None)
        )
    {
        policies_differ = true;
        refused.push(format!(
            "{} was recorded in a sandbox with another policy than the default one {} replays under (it has no host record)",
            at.display(),
            without.display()
        ));
    }
    if !refused.is_empty() {
        let help = if policies_differ && refused.len() == 1 {
            "pass --sandbox-config FILE to replay them under one policy of your choice"
        } else {
            "a cell that differs was changed after the host wrote the notebook (by the session's own code, or by hand); replay the notebook as recorded, or, for a notebook you edited and trust, a copy of it (a copy has no host record and is not checked)"
        };
        return Ok(Err((refused, help)));
    }
    Ok(Ok(Recorded {
        confinement: sandboxed.map(|(c, _)| c).or(plain),
        unrecorded,
    }))
}

/// Runs the replay on an executor made from `builder`; returns the exit status.
pub(crate) async fn run(replay: Replay, builder: CodeExecutorBuilder) -> anyhow::Result<u8> {
    let mut notebooks = Vec::new();
    for path in &replay.notebooks {
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let parsed =
            read::parse(&bytes).with_context(|| format!("cannot replay {}", path.display()))?;
        let json: serde_json::Value = serde_json::from_slice(&bytes)?;
        notebooks.push((path.clone(), bytes, json, parsed));
    }
    let (recorded, unrecorded) = match check_notebooks(&replay, &notebooks)? {
        Ok(r) => (r.confinement, r.unrecorded),
        Err((lines, help)) => {
            for line in lines {
                eprintln!("ipybox replay: {line}");
            }
            eprintln!("ipybox replay: nothing was replayed\n  help: {help}");
            return Ok(1);
        }
    };
    // The replayed code is no more trusted than when it ran: in the sandbox, the notebooks'
    // directories are not its to write either.
    let notebook_dirs: Vec<PathBuf> = notebooks
        .iter()
        .filter_map(|(path, ..)| Some(path.canonicalize().ok()?.parent()?.to_path_buf()))
        .collect();
    let entries: Vec<Entry> = notebooks.into_iter().flat_map(|(_, _, _, e)| e).collect();
    let total = entries
        .iter()
        .filter(|e| matches!(e, Entry::Code(_)))
        .count();
    if total == 0 {
        eprintln!("ipybox replay: no code cells to replay");
        return Ok(0);
    }
    let was_sandboxed = recorded.as_ref().is_some_and(|c| c.sandbox);
    // Kernels confined otherwise than by the sandbox: a replay on this host would be less
    // confined (a remote recording replayed on a Jupyter server is not).
    let confined_otherwise = recorded
        .as_ref()
        .filter(|c| c.kernel == "confined" || (c.kernel == "remote" && !replay.remote))
        .map(|c| match c.kernel.as_str() {
            "confined" => "the HTTP service's per-session confinement",
            _ => "a kernel on a Jupyter server",
        });
    let unrecorded_names = unrecorded
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let sandbox = match &replay.confinement {
        Confine::Unsandboxed => {
            if let Some(how) = was_sandboxed.then_some("a sandbox").or(confined_otherwise) {
                eprintln!(
                    "ipybox replay: the session was recorded in {how}; --unsandboxed replays it WITHOUT that confinement: its cells run on this host, unconfined"
                );
            }
            if !unrecorded.is_empty() {
                eprintln!(
                    "ipybox replay: warning: no host record shows how {unrecorded_names} was confined; --unsandboxed replays it WITHOUT the sandbox: its cells run on this host, unconfined, as you"
                );
            }
            None
        }
        Confine::Sandbox(Some(file)) => Some(SandboxOptions {
            config_file: Some(file.clone()),
            ..SandboxOptions::default()
        }),
        Confine::Sandbox(None) | Confine::Recorded => {
            match recorded.as_ref().filter(|c| c.sandbox) {
                Some(c) => {
                    let policy = c.sandbox_policy().context(
                        "the notebook's recorded sandbox policy is not one srt accepts\n  help: pass --sandbox-config FILE to replay under a policy of your choice",
                    )?;
                    Some(SandboxOptions {
                        policy: Some(policy),
                        ..SandboxOptions::default()
                    })
                }
                None if matches!(replay.confinement, Confine::Sandbox(None))
                    || !unrecorded.is_empty() =>
                {
                    Some(SandboxOptions {
                        policy: Some(SandboxPolicy::default_policy()),
                        ..SandboxOptions::default()
                    })
                }
                None => {
                    if let Some(how) = confined_otherwise {
                        anyhow::bail!(
                            "the session was recorded in {how}, which a replay on this host cannot apply: its cells would run less confined\n  help: pass --sandbox to replay in srt's sandbox, or, only for a notebook whose every cell you trust, --unsandboxed to run it on this host, unconfined"
                        );
                    }
                    None
                }
            }
        }
    };
    let sandbox = sandbox.map(|mut options| {
        options.record_dirs.extend(notebook_dirs);
        options
    });
    let mut builder = builder
        .spare_kernels(usize::from(
            entries.iter().any(|e| matches!(e, Entry::Section(_))),
        ))
        .notebook_config(NotebookConfig::in_memory());
    if let Some(options) = sandbox {
        if replay.remote {
            anyhow::bail!(
                "the replay would run in the sandbox, which cannot apply to kernels on a Jupyter server (--kernel-gateway)\n  help: replay without --kernel-gateway, or pass --unsandboxed to run the cells on the Jupyter server"
            );
        }
        let what = match (&options.config_file, &recorded) {
            (Some(file), _) => format!("the policy of {}", file.display()),
            (None, Some(c)) if c.sandbox => {
                let mut s = String::from("the recorded policy");
                if !c.left_out.is_empty() {
                    s.push_str(&format!(
                        " (not recorded, so not applied: {})",
                        c.left_out.join(", ")
                    ));
                }
                s
            }
            _ => "the default policy".into(),
        };
        let why = if !matches!(replay.confinement, Confine::Recorded) {
            "as asked".to_string()
        } else if !unrecorded.is_empty() {
            format!(
                "as {unrecorded_names} has no host record: a notebook without one replays in the sandbox, whatever its metadata says (only --unsandboxed runs it on this host)"
            )
        } else {
            "as it was recorded".to_string()
        };
        eprintln!("ipybox replay: replaying in the sandbox (srt, {what}), {why}");
        builder = builder.sandbox(options);
    }
    let executor = builder.build();
    if let Err(e) = executor.check_sandbox().await {
        anyhow::bail!(
            "cannot replay in the sandbox: {e}\n  help: make the sandbox available here; only for a notebook whose every cell you trust, pass --unsandboxed to run it on this host, unconfined"
        );
    }
    executor.start().await?;
    replay_cells(&executor, entries, total, &replay).await
}

/// Runs the notebooks' entries in order on the started `executor` (a reset where the recording
/// has one), each cell's output printed and compared with the recorded one; stops the executor
/// and returns the exit status (1 with `--check` when an output differs).
async fn replay_cells(
    executor: &ipybox::CodeExecutor,
    entries: Vec<Entry>,
    total: usize,
    replay: &Replay,
) -> anyhow::Result<u8> {
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
