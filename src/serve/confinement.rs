//! [bin] How `serve --http` confines its local sessions, from the flags: bubblewrap (probed
//! here), the files every kernel must not see, the network policy, the limits (a cgroup per
//! session) and the uid pool; and what tenants sharing the kernels would still share.
//!
//! Not here: how a plan is applied ([`ipybox::confine`]).

use std::path::{Path, PathBuf};

use anyhow::Context;
use ipybox::confine::Confinement;
use ipybox::confine::network::{NetworkPolicy, SessionNetwork};
use ipybox::host_env::HostEnv;

use super::super::flags::HttpArgs;

/// The confinement of every local session of the service: built from `http`'s flags;
/// `memory_total` bounds the service's cgroup (--service-memory). Also returns what tenants
/// would still share (`None`: nothing; see [`tenant_gap`]).
pub(crate) async fn sessions_confinement(
    http: &HttpArgs,
    workspace: &Path,
    notebooks: Option<&Path>,
    memory_total: Option<u64>,
) -> anyhow::Result<(Confinement, Option<String>)> {
    let operator_files = OperatorFiles {
        snapshot_dir: http.snapshot_dir.as_deref(),
        notebook_dir: notebooks,
        token_files: &http.token_file,
        session_secret_file: http.session_secret_file.as_deref(),
        network: NetworkPolicy {
            mode: http.session_network.unwrap_or_default(),
            allow_nets: http.session_allow_net.clone(),
            allow_domains: http.session_allow_domain.clone(),
            allow_ports: http.session_allow_port.clone(),
        },
        shown: &http.session_show,
    };
    let mut confine = confinement(workspace, operator_files).await?;
    confine.limiter = Some(std::sync::Arc::new(ipybox::confine::limits::Limiter::new(
        ipybox::confine::limits::SessionLimits {
            max_procs: http.session_max_procs,
            memory: http.session_memory.0.map_or(0, |s| s.0),
            cpus: Some(http.session_cpus).filter(|c| *c > 0.0),
            work_size: http.session_work_size.0.map_or(0, |s| s.0),
            box_size: http.session_box_size.0.map_or(0, |s| s.0),
        },
        memory_total,
    )));
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let gap = match http
        .session_uids
        .resolve(euid)
        .map_err(anyhow::Error::msg)?
    {
        Some(range) => {
            tracing::info!("sessions' uids: one per session from {range} (--session-uids)");
            confine.uids = Some(ipybox::confine::uids::UidPool::new(range));
            (http.session_network == Some(SessionNetwork::Host))
                .then(|| "confined, but with --session-network host every session reaches the host's loopback (ipybox's port and other services) and the cloud metadata address".to_string())
        }
        None => {
            tracing::info!(
                "sessions' uids: every kernel keeps ipybox's uid {euid}, without capabilities (--session-uids none)"
            );
            Some(format!(
                "confined, each tenant's kernels still run as one uid (ipybox's, {euid}: --session-uids none, or ipybox is not root), so file permissions do not separate them"
            ))
        }
    };
    Ok((confine, gap))
}

/// What tenants (tokens) sharing local kernels that ipybox does not confine would still share
/// (several tokens are refused then, unless --trust-tenants); `None` with a gateway.
pub(crate) fn unconfined_gap(gateway: bool, sandbox: bool) -> Option<String> {
    (!gateway).then(|| {
        if sandbox {
            "each tenant's code can write the workspace (`mcptools/` that the others import) and its kernels all run as this user".to_string()
        } else {
            "each tenant's code can reach the others' kernels and files, write `mcptools/` that the others import, and read `.env` and whatever ipybox's user can".to_string()
        }
    })
}

/// The operator's files a confined session must not see, wherever they are (an operator's
/// `/etc` or `/srv`, or the workspace every kernel reads).
struct OperatorFiles<'a> {
    snapshot_dir: Option<&'a Path>,
    notebook_dir: Option<&'a Path>,
    token_files: &'a [PathBuf],
    session_secret_file: Option<&'a Path>,
    network: NetworkPolicy,
    /// `--session-show`: shown read-only (checked against the files above).
    shown: &'a [PathBuf],
}

/// How `serve --http` confines local sessions: bubblewrap must work here (else a refusal that
/// names the install command and `--unconfined-sessions`); the workspace's `.env`, the
/// sessions' images and notebooks, the saved sessions (`--snapshot-dir`), the token files and
/// the session-secret file are hidden from every kernel.
async fn confinement(workspace: &Path, files: OperatorFiles<'_>) -> anyhow::Result<Confinement> {
    let shown = session_show(&files)?;
    let refuse = |e: ipybox::confine::ConfineError| {
        anyhow::anyhow!(
            "{e}\n  help: or, to run every session's code unconfined (as this user, able to reach every other session), pass --unconfined-sessions"
        )
    };
    let host = HostEnv::from_process();
    let bwrap = ipybox::confine::find_bwrap(None, &host).map_err(refuse)?;
    ipybox::confine::probe(&bwrap).await.map_err(refuse)?;
    tracing::info!(
        "sessions are confined: each kernel runs in a bubblewrap of its own ({}), the workspace read-only",
        bwrap.display()
    );
    let mut hidden = vec![workspace.join(".env"), workspace.join("images")];
    // Directories are made now: a path that does not exist when a kernel starts is not hidden.
    if let Some(dir) = files.snapshot_dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create --snapshot-dir {}", dir.display()))?;
        hidden.push(dir.to_path_buf());
    }
    if let Some(dir) = files.notebook_dir {
        use std::os::unix::fs::DirBuilderExt;
        if !dir.is_dir() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .with_context(|| {
                    format!(
                        "cannot create the notebook directory {}\n  help: pass a writable --notebook-dir, or --no-notebook",
                        dir.display()
                    )
                })?;
        }
        hidden.push(dir.to_path_buf());
    }
    hidden.extend(files.token_files.iter().cloned());
    hidden.extend(files.session_secret_file.map(Path::to_path_buf));
    // (A link, as a Kubernetes secret's file is, hides what it points to: mounts follow it.)
    tracing::info!(
        "sessions' network: {} (--session-network)",
        files.network.mode.as_str()
    );
    Ok(Confinement {
        hidden,
        bwrap: Some(bwrap),
        limiter: None,
        network: files.network,
        shown,
        uids: None,
    })
}

/// The `--session-show` paths, absolute and canonical; refused: a path that does not exist, and
/// one that holds or is inside one of ipybox's own files (token files, the session secret,
/// the data, notebook or snapshot directory).
fn session_show(files: &OperatorFiles<'_>) -> anyhow::Result<Vec<PathBuf>> {
    let mut own: Vec<(&str, PathBuf)> = Vec::new();
    own.extend(files.token_files.iter().map(|p| ("token file", p.clone())));
    own.extend(
        files
            .session_secret_file
            .map(|p| ("session-secret file", p.to_path_buf())),
    );
    own.extend(
        files
            .notebook_dir
            .map(|p| ("notebook directory", p.to_path_buf())),
    );
    own.extend(
        files
            .snapshot_dir
            .map(|p| ("snapshot directory", p.to_path_buf())),
    );
    own.extend(
        HostEnv::from_process()
            .data_dir()
            .map(|p| ("data directory ($IPYBOX_HOME)", p)),
    );
    let mut shown = Vec::new();
    for path in files.shown {
        let real = std::fs::canonicalize(path).with_context(|| {
            format!(
                "invalid --session-show {}
  help: pass an existing host path (it is shown read-only at its own path to every session's kernel)",
                path.display()
            )
        })?;
        for (what, file) in &own {
            // Compared as given and as resolved (a link in either).
            let resolved = std::fs::canonicalize(file).unwrap_or_else(|_| file.clone());
            let clash = [file, &resolved]
                .iter()
                .any(|f| f.starts_with(&real) || real.starts_with(f) || f.starts_with(path));
            if clash {
                anyhow::bail!(
                    "--session-show {} would show ipybox's {what} {} to every session
  help: show a directory that does not contain it (or move the {what} out of it)",
                    path.display(),
                    file.display()
                );
            }
        }
        shown.push(real);
    }
    Ok(shown)
}
