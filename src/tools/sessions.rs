//! [`SessionCache`]: MCP client sessions opened lazily on first use and cached per
//! (server name, params as written).
//!
//! Many concurrent callers of [`SessionCache::get_or_connect`] for the same key share one
//! connect attempt, which runs in its own task (a caller giving up does not abort it for the
//! others). A failed connect is reported to everyone waiting for it and then forgotten, so the
//! next call tries again; a session whose connection has died is replaced on the next call.
//! [`SessionCache::close_all`] (reset/stop) closes every session and reaps stdio children.
//!
//! Not here: connecting itself ([`super::client`]) and deciding when to reset.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    name: String,
    fut: Pending,
}

/// A cache of connected MCP sessions, keyed by server name and params as written.
pub struct SessionCache {
    env: Arc<HashMap<String, String>>,
    timeout: Duration,
    slots: Mutex<HashMap<String, Slot>>,
    connects: AtomicUsize,
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
            connects: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Returns the cached session for this server, connecting first if needed.
    pub async fn get_or_connect(
        &self,
        name: &str,
        params: &Value,
    ) -> Result<Arc<McpSession>, ToolsError> {
        let parsed = ServerParams::parse(params)?;
        let key = cache_key(name, params);
        for _attempt in 0..2 {
            let fut = {
                let mut slots = self.lock();
                match slots.get(&key) {
                    Some(slot) => slot.fut.clone(),
                    None => {
                        let fut = self.spawn_connect(name, parsed.clone());
                        slots.insert(
                            key.clone(),
                            Slot {
                                name: name.to_string(),
                                fut: fut.clone(),
                            },
                        );
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

    /// Closes and forgets every session whose server name is `name`.
    pub async fn close_server(&self, name: &str) {
        let taken: Vec<Slot> = {
            let mut slots = self.lock();
            let keys: Vec<String> = slots
                .iter()
                .filter(|(_, s)| s.name == name)
                .map(|(k, _)| k.clone())
                .collect();
            keys.iter().filter_map(|k| slots.remove(k)).collect()
        };
        close_slots(taken).await;
    }

    /// Closes and forgets every session (connects in progress are awaited, then closed).
    pub async fn close_all(&self) {
        let taken: Vec<Slot> = self.lock().drain().map(|(_, s)| s).collect();
        close_slots(taken).await;
    }

    /// Number of cached sessions (including connects in progress).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when no session is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many connects this cache has started (for diagnostics and tests).
    pub fn connect_count(&self) -> usize {
        self.connects.load(Ordering::SeqCst)
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
