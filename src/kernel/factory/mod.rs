//! The kernel factory: local kernels forked from a warm template process that has already
//! imported what every kernel needs, instead of each starting Python from scratch (see
//! docs/kernel.md, "The kernel factory").
//!
//! - `template`: one template process, its fork requests and the kernels it forks;
//! - `listener`: the socket the template and its kernels connect back to;
//! - `shared`: one factory shared by the pools of several executors.
//!
//! This module decides *which* template forks: it builds one when the first kernel is needed,
//! lets go of it as soon as its process ended (the next kernel gets a new one), builds a new
//! one when it breaks (its channel closed, a fork failed) or when the environment's
//! packages changed ([`Factory::invalidate`], after `install_package`), and turns itself off
//! after [`MAX_FAILURES`] failures in a row. Each kernel whose fork fails is started plainly
//! instead, with a log line ([`super::launch`]); nothing waits on a broken template.
//!
//! Not here: starting kernels up to ready ([`super::launch`]) and when kernels are started
//! ([`super::pool`]).

mod listener;
mod shared;
mod template;

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use tokio::sync::watch;
use tokio::task::AbortHandle;

use super::runtime_dir::RuntimeDir;
use super::status::ExitInfo;
use super::{KernelConfig, KernelError};
use listener::Listener;
pub use shared::SharedKernelFactory;
pub(crate) use shared::{SharedFactoryError, SharedFork, StartedFactory};
pub(crate) use template::Template;

/// Failed template starts or forks in a row after which the factory turns itself off (until
/// [`Factory::invalidate`]).
pub(crate) const MAX_FAILURES: u32 = 3;

/// How a template build ended.
#[derive(Clone)]
enum Built {
    Ready(Arc<Template>),
    Failed,
    /// Replaced by a newer build (packages changed meanwhile) or stopped.
    Superseded,
}

type Build = Shared<BoxFuture<'static, Built>>;

enum Slot {
    Empty,
    Building { build: Build, task: AbortHandle },
    Ready(Arc<Template>),
    Off,
}

struct State {
    slot: Slot,
    /// Failures (template starts and forks) since the last success.
    failures: u32,
    /// Bumped by every build: a build that finds another number when it ends was superseded.
    generation: u64,
    /// The end of every template process started, to wait for at shutdown.
    started: Vec<watch::Receiver<Option<ExitInfo>>>,
    shut: bool,
}

/// The kernel factory of one kernel pool: one template at a time, for the pool's config.
pub(crate) struct Factory {
    config: Arc<KernelConfig>,
    listener: Arc<Listener>,
    /// Where each template gets its host-only directory (`t<generation>`).
    host_dirs: std::path::PathBuf,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for Factory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Factory").finish_non_exhaustive()
    }
}

/// What went wrong, without the advice (the log line gives its own).
/// `error` for a log line: it may quote the template's stderr (hostile under `--sandbox`), so
/// it is escaped to one line.
fn reason(error: &KernelError) -> String {
    let text = match error {
        KernelError::Start { reason, .. } => reason.clone(),
        other => other.to_string(),
    };
    crate::log_text::escaped(&text).into_owned()
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl Factory {
    /// A factory whose template and kernels connect back through `<runtime>/factory/sock`. The
    /// first template is built when the first kernel is asked for.
    pub(crate) fn new(config: Arc<KernelConfig>, runtime: &RuntimeDir) -> std::io::Result<Self> {
        let listener = Listener::bind(&runtime.factory_dir()?.join("sock"))?;
        Ok(Self {
            config,
            listener: Arc::new(listener),
            host_dirs: runtime.host_kernels(),
            state: Arc::new(Mutex::new(State {
                slot: Slot::Empty,
                failures: 0,
                generation: 0,
                started: Vec::new(),
                shut: false,
            })),
        })
    }

    /// The template to fork from: the current one, else one being built (waited for), else a
    /// new one built now. None when the factory is off or the build failed (the caller then
    /// starts its kernel plainly).
    pub(crate) async fn template(&self) -> Option<Arc<Template>> {
        loop {
            let build = {
                let mut state = lock(&self.state);
                if state.shut {
                    return None;
                }
                let broken = match &state.slot {
                    Slot::Ready(t) => match t.broken() {
                        None => return Some(t.clone()),
                        Some(why) => Some(why),
                    },
                    Slot::Off => return None,
                    Slot::Empty | Slot::Building { .. } => None,
                };
                if let Some(why) = broken {
                    tracing::warn!(
                        "kernel factory: {}; building a new template (the kernel starts without it if that fails)",
                        crate::log_text::escaped(&why)
                    );
                    self.build(&mut state);
                } else if matches!(state.slot, Slot::Empty) {
                    self.build(&mut state);
                }
                match &state.slot {
                    Slot::Building { build, .. } => build.clone(),
                    _ => return None,
                }
            };
            match build.await {
                Built::Ready(t) => return Some(t),
                Built::Failed => return None,
                Built::Superseded => continue,
            }
        }
    }

    /// Starts building a template in the background (replacing whatever the slot held: a
    /// template being replaced stays alive while kernels forked from it run).
    fn build(&self, state: &mut State) {
        if let Slot::Building { task, .. } = &state.slot {
            task.abort();
        }
        state.generation += 1;
        let generation = state.generation;
        let config = self.config.clone();
        let listener = self.listener.clone();
        let dir = self.host_dirs.join(format!("t{generation}"));
        let shared: Weak<Mutex<State>> = Arc::downgrade(&self.state);
        let handle = tokio::spawn(async move {
            let started = Instant::now();
            let result = Template::start(&config, listener, dir).await;
            let Some(state) = shared.upgrade() else {
                return Built::Superseded;
            };
            let mut state = lock(&state);
            if let Ok(t) = &result {
                state.started.push(t.exit_watch());
            }
            if state.generation != generation || state.shut {
                return Built::Superseded;
            }
            match result {
                Ok(t) => {
                    tracing::debug!(
                        pid = t.pid(),
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "kernel factory: template ready"
                    );
                    let t = Arc::new(t);
                    state.slot = Slot::Ready(t.clone());
                    forget_when_it_ends(&t, shared);
                    Built::Ready(t)
                }
                Err(e) => {
                    let e = reason(&e);
                    state.failures += 1;
                    if state.failures >= MAX_FAILURES {
                        state.slot = Slot::Off;
                        tracing::warn!(
                            "kernel factory: {e}; kernels start without the factory from now on ({} failures in a row)",
                            state.failures
                        );
                    } else {
                        state.slot = Slot::Empty;
                        tracing::warn!("kernel factory: {e}; this kernel starts without it");
                    }
                    Built::Failed
                }
            }
        });
        let task = handle.abort_handle();
        let build = async move { handle.await.unwrap_or(Built::Superseded) }
            .boxed()
            .shared();
        state.slot = Slot::Building { build, task };
    }

    /// A kernel forked from the current template came up: failures no longer count.
    pub(crate) fn forked_ok(&self) {
        lock(&self.state).failures = 0;
    }

    /// A kernel forked from `template` did not start (the caller starts it plainly). The
    /// template is replaced in the background, or, after [`MAX_FAILURES`] in a row, the factory
    /// turns off.
    pub(crate) fn fork_failed(&self, template: &Arc<Template>, error: &KernelError) {
        let mut state = lock(&self.state);
        state.failures += 1;
        let current = matches!(&state.slot, Slot::Ready(t) if Arc::ptr_eq(t, template));
        let error = reason(error);
        if state.failures >= MAX_FAILURES {
            tracing::warn!(
                "kernel factory: {error}; starting the kernel without it; kernels start without the factory from now on ({} failures in a row)",
                state.failures
            );
            if let Slot::Building { task, .. } = &state.slot {
                task.abort();
            }
            state.slot = Slot::Off;
        } else {
            tracing::warn!(
                "kernel factory: {error}; starting the kernel without it{}",
                if current {
                    "; building a new template"
                } else {
                    ""
                }
            );
            if current && !state.shut {
                self.build(&mut state);
            }
        }
    }

    /// The kernel environment's packages changed (`install_package`): new kernels must come
    /// from a template that imports them afresh. Builds a new template now (in the background);
    /// the old one lives on while kernels forked from it run. Also turns a factory that had
    /// turned itself off on again.
    pub(crate) fn invalidate(&self) {
        let mut state = lock(&self.state);
        if state.shut {
            return;
        }
        state.failures = 0;
        self.build(&mut state);
    }

    /// Stops building, closes the current template and waits (up to 2 s each) until every
    /// template process started has ended. Call after the kernels are gone: templates that
    /// kernels still hold are killed when the last of those goes.
    pub(crate) async fn shutdown(&self) {
        let (slot, started) = {
            let mut state = lock(&self.state);
            state.shut = true;
            (
                std::mem::replace(&mut state.slot, Slot::Off),
                state.started.clone(),
            )
        };
        match slot {
            Slot::Ready(t) => {
                t.close(Duration::from_secs(1)).await;
                drop(t);
            }
            Slot::Building { task, .. } => task.abort(),
            Slot::Empty | Slot::Off => {}
        }
        for mut exit in started {
            let ended =
                tokio::time::timeout(Duration::from_secs(2), exit.wait_for(Option::is_some)).await;
            // Err inside: the template's handle is gone, and its watcher with it (its group
            // was killed then).
            if ended.is_err() {
                tracing::warn!("kernel factory: a template still runs 2 s after SIGKILL");
            }
        }
    }
}

/// Lets go of `template` as soon as its process has ended (and ipybox reaped it): the factory
/// then holds no handle on a dead template, and the next kernel gets a new one. Kernels forked
/// from it may still hold it (unsandboxed, they outlive it); a reaped template's handle signals
/// nothing.
fn forget_when_it_ends(template: &Arc<Template>, state: Weak<Mutex<State>>) {
    let mut exit = template.exit_watch();
    let weak = Arc::downgrade(template);
    tokio::spawn(async move {
        // Err: the template's handle was dropped (its watcher with it): nothing to forget.
        if exit.wait_for(Option::is_some).await.is_err() {
            return;
        }
        let (Some(state), Some(template)) = (state.upgrade(), weak.upgrade()) else {
            return;
        };
        let mut state = lock(&state);
        if matches!(&state.slot, Slot::Ready(t) if Arc::ptr_eq(t, &template)) {
            state.slot = Slot::Empty;
            let why = template.broken().unwrap_or_default();
            tracing::warn!(
                "kernel factory: {why}\n  a new template is built for the next kernel (the kernel starts without it if that fails)"
            );
        }
    });
}

impl Drop for Factory {
    fn drop(&mut self) {
        if let Slot::Building { task, .. } = &lock(&self.state).slot {
            task.abort();
        }
    }
}
