//! The pausable clock between approvals and executions: while a tool call waits for an approval
//! decision, the execution's timeout does not run. The approval broker (`tools`) holds a
//! [`PauseGuard`]; the execution (`kernel`) reads the count. Neither knows the other.

use std::sync::Arc;

use tokio::sync::watch;

/// Pauses execution timeouts while held: time spent waiting for an approval decision does not
/// count against the timeout. Cheap to clone; every clone controls the same executions.
#[derive(Debug, Clone)]
pub(crate) struct TimeoutPause {
    tx: Arc<watch::Sender<usize>>,
}

impl Default for TimeoutPause {
    fn default() -> Self {
        Self {
            tx: Arc::new(watch::channel(0).0),
        }
    }
}

impl TimeoutPause {
    /// Stops the clock until the returned guard is dropped.
    pub(crate) fn pause(&self) -> PauseGuard {
        self.tx.send_modify(|n| *n += 1);
        PauseGuard {
            tx: self.tx.clone(),
        }
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<usize> {
        self.tx.subscribe()
    }
}

/// See [`TimeoutPause::pause`].
#[derive(Debug)]
pub(crate) struct PauseGuard {
    tx: Arc<watch::Sender<usize>>,
}

impl Drop for PauseGuard {
    fn drop(&mut self) {
        self.tx.send_modify(|n| *n = n.saturating_sub(1));
    }
}
