//! Finding or provisioning the Python environment the kernel runs in.
//!
//! The kernel needs a Python with `ipykernel` and `pydantic`, nothing else. Order of resolution:
//!
//! 1. an explicit interpreter (the caller's, else `IPYBOX_PYTHON`): used as is; if it lacks a
//!    package the error names it and the command that installs it;
//! 2. the managed environment at [`managed_env_dir`] (`$IPYBOX_HOME/kernel-env`, by default
//!    `$XDG_DATA_HOME/ipybox/kernel-env` or `~/.local/share/ipybox/kernel-env`), created on first
//!    use with `uv` when it is on `PATH`, else with `python3 -m venv` + pip, reporting progress
//!    line by line to a [`Progress`] callback (the CLI prints it, the library logs it). An exclusive file lock makes concurrent ipybox processes wait for one another
//!    instead of corrupting the environment; a marker file written last says it is complete.
//!
//! Every command runs from `/` (see `child_process::host_command`), Python with `-I` (no
//! current directory, user site-packages or `PYTHON*` variables on its path), so nothing a
//! sandboxed kernel wrote into the workspace (`pip/__main__.py`, `uv.toml`, `pyproject.toml`,
//! `.python-version`) is picked up. The data directory is private (0700), the lock and the
//! marker 0600.
//!
//! This module does not start kernels; it only hands out an interpreter path. It reads no
//! environment variables itself: the caller passes a [`HostEnv`].

pub mod install;
pub mod requirement;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Instant;

use crate::child_process::{host_command_blocking, tail};
use crate::host_env::HostEnv;

pub use install::install_package;

/// Packages the kernel environment must hold (what is installed into a managed environment).
/// cloudpickle saves functions and classes defined in cells in a session snapshot
/// (docs/snapshots.md); a kernel without it still runs, and its snapshots name such code as not saved.
pub const KERNEL_PACKAGES: &[&str] = &["ipykernel>=6.29", "pydantic>=2.7", "cloudpickle>=3,<4"];
/// Modules checked for in an explicit interpreter.
const REQUIRED_MODULES: &[&str] = &["ipykernel", "pydantic"];
const MARKER: &str = ".ipybox-ready";

#[derive(Debug, thiserror::Error)]
pub enum PyEnvError {
    #[error(
        "python interpreter `{python}` cannot be run: {reason}\n  help: choose an existing interpreter, or set none (and no IPYBOX_PYTHON) to use the managed environment"
    )]
    NotRunnable { python: PathBuf, reason: String },
    #[error(
        "python interpreter `{python}` lacks {missing}\n  help: run `{python} -m pip install {missing}` (or `uv pip install --python {python} {missing}`), or set no interpreter (and no IPYBOX_PYTHON) to let ipybox manage an environment"
    )]
    MissingPackages { python: PathBuf, missing: String },
    #[error(
        "cannot create the kernel environment: neither `uv` nor `python3` was found on PATH\n  help: install Python 3 (3.9 or newer), or `pip install uv`, then run `ipybox setup`"
    )]
    NoBasePython,
    #[error(
        "creating the kernel environment at {dir} failed: `{command}` {status}\n{stderr_tail}\n  help: fix the problem above and run `ipybox setup` again"
    )]
    ProvisionFailed {
        dir: PathBuf,
        command: String,
        status: String,
        stderr_tail: String,
    },
    #[error(
        "cannot determine a home directory for the managed kernel environment\n  help: set IPYBOX_HOME to a writable directory"
    )]
    NoHome,
    #[error(
        "`{spec}` is not a package requirement: {reason}\n  help: pass a package name with optional extras, version and markers (`six`, `numpy>=2`, `pandas[excel]~=2.2`)"
    )]
    InvalidRequirement { spec: String, reason: String },
    #[error("refusing to install `{spec}`: {what}\n  why: {why}\n  help: {help}")]
    InstallRefused {
        spec: String,
        what: String,
        why: String,
        help: String,
    },
    #[error(
        "installing `{spec}` failed: `{command}`\n{output}\n  help: check the package name and version; the installer's output is above"
    )]
    InstallFailed {
        spec: String,
        command: String,
        output: String,
    },
    #[error(
        "i/o error on {path}: {source}\n  help: check that the directory is writable, or set IPYBOX_HOME elsewhere"
    )]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> PyEnvError + '_ {
    move |source| PyEnvError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A Python interpreter known to hold the kernel's packages.
#[derive(Debug, Clone)]
pub struct PythonEnv {
    /// The interpreter to launch the kernel with.
    pub python: PathBuf,
    /// The environment's root (`sys.prefix`) when ipybox manages it, else `None`.
    pub managed_dir: Option<PathBuf>,
}

/// Directory holding ipybox's per-user data (`$IPYBOX_HOME`, else `$XDG_DATA_HOME/ipybox`,
/// else `~/.local/share/ipybox`).
pub fn data_dir(host: &HostEnv) -> Result<PathBuf, PyEnvError> {
    host.data_dir().ok_or(PyEnvError::NoHome)
}

/// Where the managed kernel environment lives.
pub fn managed_env_dir(host: &HostEnv) -> Result<PathBuf, PyEnvError> {
    Ok(data_dir(host)?.join("kernel-env"))
}

/// Where provisioning reports what it does (one line per call): the CLI prints it, the library
/// default ([`log_progress`]) logs it.
pub type Progress = Arc<dyn Fn(&str) + Send + Sync>;

/// Progress as `tracing` events (target `ipybox::pyenv`, level info).
pub fn log_progress() -> Progress {
    Arc::new(|line: &str| tracing::info!("{line}"))
}

/// Resolves the kernel's interpreter: `explicit` (or `IPYBOX_PYTHON`) if given, else the managed
/// environment, provisioning it on first use (reporting to `progress`).
pub fn resolve(
    explicit: Option<&Path>,
    host: &HostEnv,
    progress: &Progress,
) -> Result<PythonEnv, PyEnvError> {
    let from_env = host.get("IPYBOX_PYTHON").map(PathBuf::from);
    match explicit.map(Path::to_path_buf).or(from_env) {
        Some(python) => check_interpreter(&python).map(|()| PythonEnv {
            python,
            managed_dir: None,
        }),
        None => ensure_managed(&managed_env_dir(host)?, host, progress),
    }
}

/// Checks that `python` runs and can import the kernel's packages.
pub fn check_interpreter(python: &Path) -> Result<(), PyEnvError> {
    let probe = format!(
        "import importlib.util as u; print(' '.join(m for m in {REQUIRED_MODULES:?} if u.find_spec(m) is None))"
    );
    let out = host_command_blocking(python)
        .args(["-I", "-c", &probe])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| PyEnvError::NotRunnable {
            python: python.to_path_buf(),
            reason: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(PyEnvError::NotRunnable {
            python: python.to_path_buf(),
            reason: format!("{} ({})", out.status, tail(&out.stderr)),
        });
    }
    let missing = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(PyEnvError::MissingPackages {
            python: python.to_path_buf(),
            missing,
        })
    }
}

/// Completes an environment an older ipybox made (its marker names fewer packages): installs
/// [`KERNEL_PACKAGES`] into it, keeping what the user installed there (`install_package`).
/// False when there is no such environment or the install fails (the caller recreates it).
fn upgrade(dir: &Path, host: &HostEnv, progress: &Progress) -> bool {
    let python = env_python(dir);
    if !dir.join(MARKER).is_file() || check_interpreter(&python).is_err() {
        return false;
    }
    progress(&format!(
        "adding {} to the kernel environment at {}",
        KERNEL_PACKAGES.join(" "),
        dir.display()
    ));
    let packages = KERNEL_PACKAGES.iter().map(|s| s.to_string());
    let (program, args): (PathBuf, Vec<String>) = match host.find_on_path("uv") {
        Some(uv) => {
            let mut args = vec![
                "pip".to_string(),
                "install".into(),
                "--python".into(),
                python.display().to_string(),
            ];
            args.extend(packages);
            (uv, args)
        }
        None => {
            let mut args = vec![
                "-I".to_string(),
                "-m".into(),
                "pip".into(),
                "install".into(),
                "--disable-pip-version-check".into(),
            ];
            args.extend(packages);
            (python.clone(), args)
        }
    };
    match run_reporting(&program, &args, progress) {
        Ok(out) if out.status.success() && check_interpreter(&python).is_ok() => {
            let marker = dir.join(MARKER);
            crate::safe_fs::write_private(&marker, marker_contents().as_bytes()).is_ok()
        }
        Ok(out) => {
            progress(&format!(
                "could not complete the kernel environment ({}); creating it anew",
                out.status
            ));
            false
        }
        Err(e) => {
            progress(&format!(
                "could not complete the kernel environment ({e}); creating it anew"
            ));
            false
        }
    }
}

fn env_python(dir: &Path) -> PathBuf {
    dir.join("bin/python")
}

fn marker_contents() -> String {
    KERNEL_PACKAGES.join(" ")
}

fn is_ready(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join(MARKER)).is_ok_and(|m| m.trim() == marker_contents())
        && env_python(dir).exists()
}

/// Returns the managed environment at `dir`, creating it first if it is missing or incomplete.
pub fn ensure_managed(
    dir: &Path,
    host: &HostEnv,
    progress: &Progress,
) -> Result<PythonEnv, PyEnvError> {
    let env = PythonEnv {
        python: env_python(dir),
        managed_dir: Some(dir.to_path_buf()),
    };
    if is_ready(dir) {
        return Ok(env);
    }
    let parent = dir.parent().unwrap_or(Path::new("."));
    // The data directory (`$IPYBOX_HOME`) is private: registrations and the kernel ledger live
    // there too.
    crate::safe_fs::create_private_dir(parent).map_err(io_err(parent))?;
    let lock_path = dir.with_extension("lock");
    let lock = crate::safe_fs::open_lock_file(&lock_path).map_err(io_err(&lock_path))?;
    if fs4::fs_std::FileExt::try_lock_exclusive(&lock).map_or(true, |locked| !locked) {
        progress(&format!(
            "waiting for another ipybox to finish creating {}",
            dir.display()
        ));
        fs4::fs_std::FileExt::lock_exclusive(&lock).map_err(io_err(&lock_path))?;
    }
    if is_ready(dir) {
        return Ok(env);
    }
    provision(dir, host, progress)?;
    Ok(env)
}

fn provision(dir: &Path, host: &HostEnv, progress: &Progress) -> Result<(), PyEnvError> {
    let started = Instant::now();
    if upgrade(dir, host, progress) {
        return Ok(());
    }
    if dir.exists() {
        progress(&format!(
            "removing incomplete kernel environment at {}",
            dir.display()
        ));
        std::fs::remove_dir_all(dir).map_err(io_err(dir))?;
    }
    let python = env_python(dir);
    let packages = KERNEL_PACKAGES.iter().map(|s| s.to_string());
    let steps: Vec<(PathBuf, Vec<String>)> = if let Some(uv) = host.find_on_path("uv") {
        progress(&format!(
            "creating the kernel environment at {} with uv",
            dir.display()
        ));
        let base = host
            .find_on_path("python3")
            .map(|p| p.display().to_string());
        let mut venv = vec!["venv".to_string(), "--quiet".into(), "--seed".into()];
        if let Some(base) = base {
            venv.extend(["--python".to_string(), base]);
        }
        venv.push(dir.display().to_string());
        let mut install = vec![
            "pip".to_string(),
            "install".into(),
            "--python".into(),
            python.display().to_string(),
        ];
        install.extend(packages);
        vec![(uv.clone(), venv), (uv, install)]
    } else if let Some(python3) = host.find_on_path("python3") {
        progress(&format!(
            "creating the kernel environment at {} with python3 -m venv + pip (install uv to make this ~10x faster)",
            dir.display()
        ));
        let mut install = vec![
            "-I".to_string(),
            "-m".into(),
            "pip".into(),
            "install".into(),
            "--disable-pip-version-check".into(),
        ];
        install.extend(packages);
        vec![
            (
                python3,
                vec![
                    "-I".to_string(),
                    "-m".into(),
                    "venv".into(),
                    dir.display().to_string(),
                ],
            ),
            (python.clone(), install),
        ]
    } else {
        return Err(PyEnvError::NoBasePython);
    };
    for (program, args) in steps {
        let command = format!("{} {}", program.display(), args.join(" "));
        progress(&format!("running {command}"));
        let out = run_reporting(&program, &args, progress).map_err(io_err(&program))?;
        if !out.status.success() {
            let _ = std::fs::remove_dir_all(dir);
            return Err(PyEnvError::ProvisionFailed {
                dir: dir.to_path_buf(),
                command,
                status: out.status.to_string(),
                stderr_tail: tail(out.stderr.as_bytes()),
            });
        }
    }
    check_interpreter(&python)?;
    let marker = dir.join(MARKER);
    crate::safe_fs::write_private(&marker, marker_contents().as_bytes())
        .map_err(io_err(&marker))?;
    progress(&format!(
        "kernel environment ready at {} ({:.1} s)",
        dir.display(),
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// What an installer step printed.
struct StepOutput {
    status: std::process::ExitStatus,
    stderr: String,
}

/// Runs an installer step, passing each line it prints (stdout and stderr) to `progress` as it
/// comes; stderr is also kept for the error message.
fn run_reporting(
    program: &Path,
    args: &[String],
    progress: &Progress,
) -> std::io::Result<StepOutput> {
    use std::io::BufRead;
    let mut child = host_command_blocking(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr = child.stderr.take().expect("piped stderr");
    let out_progress = progress.clone();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            out_progress(&line);
        }
    });
    let mut kept = String::new();
    for line in std::io::BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
    {
        progress(&line);
        kept.push_str(&line);
        kept.push('\n');
    }
    let _ = reader.join();
    Ok(StepOutput {
        status: child.wait()?,
        stderr: kept,
    })
}
