//! [`SessionCache`]: MCP client sessions opened lazily on first use and cached per
//! (server name, params as written).
//!
//! Many concurrent callers of [`SessionCache::get_or_connect`] for the same key share one
//! connect attempt, which runs in its own task (a caller giving up does not abort it for the
//! others). A failed connect is reported to everyone waiting for it and then forgotten, so the
//! next call tries again; a session whose connection has died is replaced on the next call.
//! [`SessionCache::close_all`] (stop) closes every session and reaps stdio children, and starts a
//! new epoch: a call that began before it (a leftover thread of the old kernel, a call that
//! waited for approval) cannot open a session afterwards, so nothing outlives a reset.
//! [`SessionCache::close_all_in_background`] (reset) does the same without waiting for the
//! sessions to close (a stdio server gets 500 ms to exit after its stdin closes): the epoch
//! already keeps them from being used, and [`SessionCache::close_all`] waits for those closes
//! too, so stop still leaves nothing running.
//!
//! Not here: connecting itself (`super::client`) and deciding when to reset.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use serde_json::Value;

use super::ToolsError;
use super::client::McpSession;
use super::params::ServerParams;

type Pending = Shared<BoxFuture<'static, Result<Arc<McpSession>, ToolsError>>>;

struct Slot {
    fut: Pending,
}

/// A cache of connected MCP sessions, keyed by server name and params as written.
pub struct SessionCache {
    env: Arc<HashMap<String, String>>,
    timeout: Duration,
    slots: Mutex<HashMap<String, Slot>>,
    /// Bumped by every [`SessionCache::close_all`].
    epoch: AtomicU64,
    connects: AtomicUsize,
    /// Closes started by [`SessionCache::close_all_in_background`] that may still run.
    closing: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for SessionCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionCache")
            .field("timeout", &self.timeout)
            .field("sessions", &self.len())
            .finish_non_exhaustive()
    }
}

fn cache_key(name: &str, params: &Value) -> String {
    // serde_json keeps object order (preserve_order), so "as written" includes key order.
    format!("{name}\u{0}{params}")
}

impl SessionCache {
    /// `env` is used for `${VAR}` substitution and the stdio base environment; `timeout` bounds
    /// each connect (spawn + handshake).
    pub fn new(env: HashMap<String, String>, timeout: Duration) -> Self {
        Self {
            env: Arc::new(env),
            timeout,
            slots: Mutex::new(HashMap::new()),
            epoch: AtomicU64::new(0),
            connects: AtomicUsize::new(0),
            closing: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current epoch: taken when a call begins, passed to
    /// [`SessionCache::get_or_connect_since`].
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Returns the cached session for this server, connecting first if needed.
    pub async fn get_or_connect(
        &self,
        name: &str,
        params: &Value,
    ) -> Result<Arc<McpSession>, ToolsError> {
        self.get_or_connect_since(name, params, self.epoch()).await
    }

    /// [`SessionCache::get_or_connect`] for a call that began at `epoch`: fails with
    /// [`ToolsError::Closed`] when the sessions were closed since.
    pub(crate) async fn get_or_connect_since(
        &self,
        name: &str,
        params: &Value,
        epoch: u64,
    ) -> Result<Arc<McpSession>, ToolsError> {
        let parsed = ServerParams::parse(params)?;
        let key = cache_key(name, params);
        for _attempt in 0..2 {
            let fut = {
                let mut slots = self.lock();
                // Checked under the lock that close_all drains with: no slot is added after it.
                if self.epoch() != epoch {
                    return Err(ToolsError::Closed {
                        target: format!("`{name}`"),
                    });
                }
                match slots.get(&key) {
                    Some(slot) => slot.fut.clone(),
                    None => {
                        let fut = self.spawn_connect(name, parsed.clone());
                        slots.insert(key.clone(), Slot { fut: fut.clone() });
                        fut
                    }
                }
            };
            let result = fut.clone().await;
            let stale = match &result {
                Ok(session) => session.is_closed(),
                Err(_) => true,
            };
            if stale {
                let mut slots = self.lock();
                if slots.get(&key).is_some_and(|s| s.fut.ptr_eq(&fut)) {
                    slots.remove(&key);
                }
            }
            match result {
                Ok(session) if session.is_closed() => {
                    tracing::info!(server = name, "MCP session was closed; reconnecting");
                    session.shutdown().await;
                    continue;
                }
                other => return other,
            }
        }
        Err(ToolsError::Request {
            target: format!("`{name}`"),
            method: "initialize".into(),
            reason: "the connection closed right after it was opened, twice".into(),
            stderr: None,
        })
    }

    fn spawn_connect(&self, name: &str, params: ServerParams) -> Pending {
        self.connects.fetch_add(1, Ordering::SeqCst);
        let env = self.env.clone();
        let timeout = self.timeout;
        let name = name.to_string();
        let task = tokio::spawn(async move {
            McpSession::connect_named(Some(&name), &params, &env, timeout)
                .await
                .map(Arc::new)
        });
        async move {
            match task.await {
                Ok(r) => r,
                Err(e) => Err(ToolsError::Request {
                    target: "?".into(),
                    method: "initialize".into(),
                    reason: format!("the connect task failed: {e}"),
                    stderr: None,
                }),
            }
        }
        .boxed()
        .shared()
    }

    /// Closes and forgets every session (connects in progress are awaited, then closed) and
    /// starts a new epoch; returns once they are closed, and so are those of earlier
    /// [`SessionCache::close_all_in_background`] calls.
    pub async fn close_all(&self) {
        let taken = self.take_all();
        close_slots(taken).await;
        let closing: Vec<_> =
            std::mem::take(&mut *self.closing.lock().unwrap_or_else(|p| p.into_inner()));
        for task in closing {
            let _ = task.await;
        }
    }

    /// Forgets every session and starts a new epoch at once, as [`SessionCache::close_all`]
    /// does, and closes them on a task of their own: no call can use them any more, and
    /// nothing waits for a stdio server to exit. [`SessionCache::close_all`] waits for them.
    pub fn close_all_in_background(&self) {
        let taken = self.take_all();
        if taken.is_empty() {
            return;
        }
        let task = tokio::spawn(close_slots(taken));
        let mut closing = self.closing.lock().unwrap_or_else(|p| p.into_inner());
        closing.retain(|t| !t.is_finished());
        closing.push(task);
    }

    /// Forgets every session and starts a new epoch, as [`SessionCache::close_all`] does, but
    /// kills each connected stdio server's process group at once instead of closing it, and
    /// waits for nothing: for a process about to exit. A connect still in progress is dropped
    /// with its task (its child is killed on drop).
    pub fn kill_all(&self) {
        for slot in self.take_all() {
            if let Some(Ok(session)) = slot.fut.peek() {
                session.kill_now();
            }
        }
        for task in std::mem::take(&mut *self.closing.lock().unwrap_or_else(|p| p.into_inner())) {
            task.abort();
        }
    }

    fn take_all(&self) -> Vec<Slot> {
        let mut slots = self.lock();
        self.epoch.fetch_add(1, Ordering::SeqCst);
        slots.drain().map(|(_, s)| s).collect()
    }

    /// Number of cached sessions (including connects in progress).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when no session is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many connects this cache has started (sharing and reconnects are visible in it).
    pub fn connect_count(&self) -> usize {
        self.connects.load(Ordering::SeqCst)
    }
}

/// The stdio MCP servers of several executors (the sessions of `ipybox serve --http`), shared:
/// one process per server name and params for all of them
/// ([`crate::executor::CodeExecutorBuilder::shared_mcp_servers`]). A session cache made by the
/// first executor that calls a server (with its `${VAR}` environment and connect timeout;
/// executors that share one are built alike). An executor's reset or stop leaves it alone;
/// [`SharedMcpServers::close_all`] closes every server. Cheap to clone; clones are the same.
#[derive(Clone, Default)]
pub struct SharedMcpServers(Arc<std::sync::OnceLock<Arc<SessionCache>>>);

impl std::fmt::Debug for SharedMcpServers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedMcpServers")
            .field("sessions", &self.0.get().map_or(0, |c| c.len()))
            .finish()
    }
}

impl SharedMcpServers {
    pub fn new() -> Self {
        Self::default()
    }

    /// The shared cache, made now with `env` and `timeout` if this is the first use.
    pub(crate) fn cache(
        &self,
        env: HashMap<String, String>,
        timeout: Duration,
    ) -> Arc<SessionCache> {
        self.0
            .get_or_init(|| Arc::new(SessionCache::new(env, timeout)))
            .clone()
    }

    /// How many shared servers are connected (or connecting).
    pub fn len(&self) -> usize {
        self.0.get().map_or(0, |c| c.len())
    }

    /// True when no shared server is connected.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes every shared server and waits until they are gone (the service's shutdown);
    /// a call that began before it is not made. Servers are started again on the next call.
    pub async fn close_all(&self) {
        if let Some(cache) = self.0.get() {
            cache.close_all().await;
        }
    }
}

async fn close_slots(slots: Vec<Slot>) {
    futures::future::join_all(slots.into_iter().map(|s| async move {
        if let Ok(session) = s.fut.await {
            session.shutdown().await;
        }
    }))
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_from_before_close_all_opens_nothing() {
        let cache = SessionCache::new(HashMap::new(), Duration::from_secs(5));
        let params = serde_json::json!({"command": "does-not-matter"});
        let before = cache.epoch();
        cache.close_all().await;
        let err = cache
            .get_or_connect_since("fx", &params, before)
            .await
            .unwrap_err();
        assert!(matches!(err, ToolsError::Closed { .. }), "{err}");
        assert_eq!(cache.connect_count(), 0, "nothing was started");
        assert!(cache.is_empty());
    }
}
