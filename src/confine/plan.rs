//! A confined session's confinement, composed in one place and in this order (each step needs
//! the ones before it):
//!
//! 1. uid lease: the session's own uid and gid (`--session-uids`), held until its kernels stop;
//! 2. hand-over: what that uid needs of the runtime directory (the tool socket, `box/`,
//!    `work/`), before anything is mounted on `work/`;
//! 3. limits: the session's cgroup (else resource limits) and its work directory's tmpfs;
//! 4. view: what the kernel sees of the host (`Layout`), 5. user: as that uid;
//! 6. identity + seccomp: the uid the kernel drops to and the filter it installs;
//! 7. wrapper: bubblewrap around a launched kernel (and the same plan for a forked one);
//! 8. egress proxy: the session's own proxy socket (`--session-network proxy`), 9. proxy env.
//!
//! Both kernel paths take the plan from here: a launched kernel runs under [`SessionPlan::wrapper`],
//! a kernel forked from a shared template applies [`SessionPlan::fork_plan`] (and the template
//! itself runs under [`SessionPlan::template_wrapper`]); both hosts (the SDK/stdio executor and
//! each session of `serve --http`) reach it through `CodeExecutor::start`. Not here: each step's
//! mechanism (its own file of `confine/`), the flags (`main.rs`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::child_process::CommandWrapper;
use crate::host_env::HostEnv;

use super::Confinement;
use super::egress_proxy::EgressProxy;
use super::identity::KernelIdentity;
use super::limits::{KernelLimits, Limiter, WorkMount, format_bytes};
use super::network::{EGRESS_SOCKET, SessionNetwork, proxy_env};
use super::uids::UidLease;

/// Where the session's kernels run: the parts of its runtime directory the plan reads.
pub(crate) struct SessionPlace<'a> {
    pub(crate) host: &'a HostEnv,
    /// The session's runtime directory.
    pub(crate) runtime: &'a Path,
    /// Its kernel-writable part (`box/`), opened without following a link.
    pub(crate) writable: &'a Path,
    pub(crate) workspace: &'a Path,
    pub(crate) python: &'a Path,
    /// The tool server's socket, handed to the session's uid.
    pub(crate) tool_socket: &'a Path,
    /// The name the egress proxy logs the session by.
    pub(crate) tag: String,
    /// A shared kernel factory's directory, when the session's kernels are forked from its
    /// template (its `python/` is bound back into their view).
    pub(crate) shared_dir: Option<&'a Path>,
}

/// Why a plan could not be made: a file the host could not prepare, or a resource the service
/// has none of (words and advice for the user, as the kernel start error shows them).
#[derive(Debug)]
pub(crate) enum PlanError {
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    Start {
        reason: String,
        help: String,
    },
}

/// What the session's kernels start with, and what it holds while they run.
#[derive(Debug)]
pub(crate) struct SessionPlan {
    /// bubblewrap around a launched kernel.
    pub(crate) wrapper: CommandWrapper,
    /// For a kernel forked from a shared template: the same view and identity, as the plan the
    /// template's child applies.
    pub(crate) fork_plan: Option<serde_json::Value>,
    /// The kernel's working directory (`<runtime>/work`).
    pub(crate) cwd: PathBuf,
    /// The session's cgroup (or resource limits), its work directory's tmpfs and its kernel
    /// directory's (`box/`).
    pub(crate) limits: Option<(KernelLimits, Option<WorkMount>, Option<WorkMount>)>,
    /// Variables the kernel gets (the egress proxy's).
    pub(crate) env: Vec<(String, String)>,
    /// The session's egress proxy, running until dropped.
    pub(crate) egress: Option<EgressProxy>,
    /// The session's uid, leased until dropped.
    pub(crate) uid: Option<UidLease>,
}

impl SessionPlan {
    /// The plan of one confined session, top to bottom (see the module comment).
    pub(crate) fn build(
        confinement: &Confinement,
        bwrap: &Path,
        at: SessionPlace<'_>,
    ) -> Result<SessionPlan, PlanError> {
        let runtime = at.runtime;
        let io = |source| PlanError::Io {
            path: runtime.to_path_buf(),
            source,
        };
        let work = runtime.join(super::WORK_DIR);
        crate::safe_fs::create_private_dir(&work).map_err(io)?;
        // 1, 2: the session's own uid, handed what it needs before anything is mounted.
        let uid = match &confinement.uids {
            Some(pool) => {
                let lease = pool.lease().map_err(|e| PlanError::Start {
                    reason: e.to_string(),
                    help: "close sessions, or give a larger --session-uids range".into(),
                })?;
                super::uids::hand_over(runtime, lease.ids, &[at.tool_socket]).map_err(io)?;
                Some(lease)
            }
            None => None,
        };
        // 3: limits.
        let limits = match &confinement.limiter {
            Some(limiter) => Some(session_limits(limiter, &work, at.writable)?),
            None => None,
        };
        // 4, 5: the view, as the session's user.
        let mut layout = super::Layout::new(
            at.host,
            runtime,
            at.writable,
            at.workspace,
            at.python,
            confinement,
        );
        if let Some(lease) = &uid {
            layout = layout
                .with_session_user(at.host, runtime, lease.ids.uid, lease.ids.gid)
                .map_err(io)?;
        }
        // 6: identity + seccomp.
        let identity = KernelIdentity {
            ids: uid.as_ref().map(|lease| lease.ids),
            seccomp: super::seccomp::write(runtime).map_err(io)?,
        };
        // 7: the wrapper, and the same for a forked kernel (which binds ipybox's kernel-side
        // Python back from the template's copy: its preloaded modules came from there).
        let fork_plan = at.shared_dir.map(|dir| {
            let mut plan = layout
                .clone()
                .show_read_only(dir.join("python"))
                .fork_plan();
            identity.add_to_plan(&mut plan);
            plan
        });
        let wrapper = super::wrapper(bwrap, layout, &identity);
        // 8, 9: the egress proxy and its variables.
        let (egress, env) = if confinement.network.mode == SessionNetwork::Proxy {
            let socket = runtime.join(EGRESS_SOCKET);
            let socket_io = |source| PlanError::Io {
                path: socket.clone(),
                source,
            };
            let proxy = EgressProxy::start(&socket, Arc::new(confinement.network.clone()), at.tag)
                .map_err(socket_io)?;
            if let Some(lease) = &uid {
                super::uids::hand_over(runtime, lease.ids, &[&socket]).map_err(socket_io)?;
            }
            (Some(proxy), proxy_env(&socket).into_iter().collect())
        } else {
            (None, Vec::new())
        };
        Ok(SessionPlan {
            wrapper,
            fork_plan,
            cwd: work,
            limits,
            env,
            egress,
            uid,
        })
    }

    /// The shared template's wrapper (one for all sessions: their kernels are its forks, each
    /// applying its own [`SessionPlan::fork_plan`]): its view of the factory directory `dir`,
    /// with the sessions' work mounts, made later on the host, reaching it.
    pub(crate) fn template_wrapper(
        confinement: &Confinement,
        bwrap: &Path,
        host: &HostEnv,
        dir: &Path,
        workspace: &Path,
        python: &Path,
    ) -> std::io::Result<CommandWrapper> {
        if confinement
            .limiter
            .as_ref()
            .is_some_and(|l| l.limits.work_size > 0 || l.limits.box_size > 0)
        {
            // Work and kernel directories' tmpfs mounts, made later on the host, must reach the
            // template's view (and so its forks).
            super::limits::share_mounts_below(dir)?;
        }
        let layout = super::Layout::for_template(host, dir, workspace, python, confinement);
        Ok(super::template_wrapper(bwrap, layout))
    }
}

/// A new session's cgroup (or resource limits), its work directory's tmpfs on `work`, and the
/// tmpfs of `--session-box-size` on its kernel directory `boxed` (before its kernels bind their
/// sockets there).
fn session_limits(
    limiter: &Limiter,
    work: &Path,
    boxed: &Path,
) -> Result<(KernelLimits, Option<WorkMount>, Option<WorkMount>), PlanError> {
    let limits = limiter.for_session().map_err(|e| PlanError::Start {
        reason: e.to_string(),
        help:
            "check that ipybox may create cgroups (the `session limits` line of its log at start)"
                .into(),
    })?;
    let mount = WorkMount::mount(work, limiter.limits.work_size).map_err(|e| PlanError::Start {
        reason: format!(
            "cannot mount the session's work directory ({} of tmpfs, --session-work-size) on {}: {e}",
            format_bytes(limiter.limits.work_size),
            work.display()
        ),
        help: "pass --session-work-size off for no limit on the work directory".into(),
    })?;
    let size = limiter.limits.box_size;
    let boxed_mount = WorkMount::mount_box(boxed, size).map_err(|e| PlanError::Start {
        reason: format!(
            "cannot mount the session's kernel directory ({} of tmpfs, --session-box-size) on {}: {e}",
            format_bytes(size),
            boxed.display()
        ),
        help: "pass --session-box-size off for no limit on it".into(),
    })?;
    Ok((limits, mount, boxed_mount))
}
