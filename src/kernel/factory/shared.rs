//! One kernel factory shared by the kernel pools of several executors: the sessions of
//! `ipybox serve --http` fork their kernels from one template process (a zygote) instead of
//! launching each or keeping a template each (see docs/kernel.md, "One template for many
//! executors").
//!
//! The first executor that needs it starts it ([`SharedKernelFactory::get_or_start`]): a private
//! directory of its own (`ipybox-<pid>-<random>` where runtime directories live) that holds the
//! factory's socket, the template's copy of ipybox's kernel-side Python and, below it, the
//! runtime directory of every executor that shares it; and a [`Factory`] whose template is
//! started with the config the executor makes for it (a confined executor: inside the base
//! bubblewrap of [`crate::confine::template_wrapper`]). Each fork request of a sharing executor
//! carries that executor's kernel environment and, when it is confined, the plan the forked
//! kernel confines itself with ([`SharedFork`]).
//!
//! Not here: which executors share one (the caller's choice), how a template forks
//! ([`super::template`]), when templates are rebuilt ([`super::Factory`]).

use std::path::Path;
use std::sync::{Arc, Mutex};

use super::Factory;
use crate::host_env::HostEnv;
use crate::kernel::KernelConfig;
use crate::kernel::runtime_dir::{CreateError, MountCleanUp, RuntimeDir, Sockets};

/// A kernel factory that several executors share: kernels of every executor built with a
/// clone of it ([`crate::executor::CodeExecutorBuilder::shared_kernel_factory`]) are forked from
/// one template process. Cheap to clone; clones are the same factory. The first executor to
/// start decides the template (interpreter, environment, workspace, confinement): executors
/// that share one are built alike, apart from where their images go. Stop it with
/// [`SharedKernelFactory::shutdown`] once every executor that used it has stopped (dropping the
/// last clone also kills the template).
#[derive(Clone, Default)]
pub struct SharedKernelFactory(Arc<Mutex<Slot>>);

#[derive(Default)]
struct Slot {
    ready: Option<Arc<StartedFactory>>,
    shut: bool,
}

impl std::fmt::Debug for SharedKernelFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let started = self.lock().ready.is_some();
        f.debug_struct("SharedKernelFactory")
            .field("started", &started)
            .finish()
    }
}

/// A started shared factory: its directory (removed when the last user lets go) and factory.
pub(crate) struct StartedFactory {
    // Declared first: the factory (its socket, its template) goes before the directory.
    factory: Arc<Factory>,
    dir: RuntimeDir,
}

impl StartedFactory {
    /// The directory that holds the factory's socket and every sharing executor's runtime
    /// directory.
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// What a kernel pool forks with when its executor shares a factory.
#[derive(Clone)]
pub(crate) struct SharedFork {
    pub(in crate::kernel) factory: Arc<Factory>,
    /// Keeps the shared directory (where the executor's runtime directory lives) while a pool
    /// uses it.
    _shared: Arc<StartedFactory>,
    /// What each forked kernel does to confine itself (`confine_child.py`'s plan), if the
    /// executor is confined.
    pub(crate) confine: Option<Arc<serde_json::Value>>,
}

impl SharedFork {
    pub(crate) fn new(shared: &Arc<StartedFactory>, confine: Option<serde_json::Value>) -> Self {
        Self {
            factory: shared.factory.clone(),
            _shared: shared.clone(),
            confine: confine.map(Arc::new),
        }
    }
}

/// Why a shared kernel factory cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SharedFactoryError {
    /// Its directory or socket could not be made.
    #[error("cannot prepare the shared kernel factory in {path}: {source}")]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// Its directory's socket paths would be too long.
    #[error(transparent)]
    SocketPath(crate::kernel::SocketPathTooLong),
    /// It was shut down.
    #[error("the shared kernel factory was shut down")]
    Shut,
}

impl SharedKernelFactory {
    /// A shared factory that starts when the first executor needs it.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The started factory, else a new one: its directory under `host`'s runtime base, and a
    /// factory whose template is started (on the first fork) with the config `template` makes
    /// for the directory's path.
    pub(crate) fn get_or_start(
        &self,
        host: &HostEnv,
        clean_up: MountCleanUp,
        template: impl FnOnce(&Path) -> std::io::Result<KernelConfig>,
    ) -> Result<Arc<StartedFactory>, SharedFactoryError> {
        let mut slot = self.lock();
        if slot.shut {
            return Err(SharedFactoryError::Shut);
        }
        if let Some(ready) = &slot.ready {
            return Ok(ready.clone());
        }
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| SharedFactoryError::Io { path, source }
        };
        let base = RuntimeDir::base_dir(host);
        let dir = RuntimeDir::create(host, Sockets::Shared, clean_up).map_err(|e| match e {
            CreateError::TooLong(e) => SharedFactoryError::SocketPath(e),
            CreateError::Io(e) => io(&base)(e),
        })?;
        let config = template(dir.path()).map_err(io(dir.path()))?;
        let factory = Factory::new(Arc::new(config), &dir).map_err(io(dir.path()))?;
        let shared = Arc::new(StartedFactory {
            factory: Arc::new(factory),
            dir,
        });
        slot.ready = Some(shared.clone());
        Ok(shared)
    }

    /// Stops the template (killing the kernels it forked that still run) and lets go of the
    /// directory; executors that start afterwards fail. Call after every executor that used it
    /// has stopped.
    pub async fn shutdown(&self) {
        let ready = {
            let mut slot = self.lock();
            slot.shut = true;
            slot.ready.take()
        };
        if let Some(shared) = ready {
            shared.factory.shutdown().await;
        }
    }
}
