//! [bin] Which TCP connections `ipybox serve --http` keeps, so that peers without a token cannot
//! lock its clients out (issue 27, item 4: idle sockets used to fill the connection cap).
//!
//! - **Accepting never stops.** A new connection is refused only when every open connection is
//!   busy with a request (all of the cap at work for real clients).
//! - **A connection must send a complete request head within `--first-request-timeout`**
//!   (default 5 s) of being accepted, or it is closed. Clients send their request as soon as
//!   they connect; a socket that sends nothing holds a place for 5 s, not 30.
//! - **Between requests** an authenticated connection may stay idle for `--keep-alive-timeout`
//!   (default 120 s, longer than the clients' own pools keep idle connections: reqwest/rmcp
//!   90 s, httpx 5 s, Node 4–5 s), then it is closed; one that has not authenticated, no longer
//!   than the first request timeout. While a request is in progress (a running call, an SSE
//!   stream) nothing closes it.
//! - **Per address** (an IPv4 address, an IPv6 /64), at most `--max-connections-per-address`
//!   (default 64) connections that have not yet authenticated (no request with an accepted
//!   token, or with no token configured, no `/mcp` request) are open; one more replaces that
//!   address's oldest idle one. Authenticated connections count only toward the global cap.
//! - **At the global cap** (`--max-connections`, default 4096), a new connection replaces the
//!   oldest idle connection that has not authenticated, else the oldest idle one; new clients get
//!   in, and what is shed is what an attacker holds.
//!
//! The bound: a peer without a token holds at most 64 connections per address, each idle for at
//! most 5 s (it must send a complete request at least every 5 s to keep one); it can make a
//! real client's connection wait for nothing. Not here: the token check ([`super::auth`]),
//! serving requests.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::super::metrics::{self, ConnectionClosed};

/// What the command line sets.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) max_connections: usize,
    pub(crate) max_per_address: usize,
    pub(crate) first_request: Duration,
    pub(crate) keep_alive: Duration,
}

/// The open connections.
pub(crate) struct Connections {
    limits: Limits,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    /// By accept order (oldest first).
    open: BTreeMap<u64, Conn>,
    /// Unauthenticated connections per address.
    unauthenticated: HashMap<Peer, usize>,
    next: u64,
}

/// A peer address as counted: IPv4 addresses one by one, IPv6 by /64 (one host's share).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Peer {
    V4(u32),
    V6(u64),
}

impl From<IpAddr> for Peer {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Peer::V4(u32::from(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Peer::V4(u32::from(v4)),
                None => Peer::V6((u128::from(v6) >> 64) as u64),
            },
        }
    }
}

struct Conn {
    peer: Peer,
    accepted: Instant,
    last_active: Instant,
    requests: u64,
    in_flight: u32,
    authenticated: bool,
    close: CancellationToken,
}

impl Conn {
    fn idle(&self) -> bool {
        self.in_flight == 0
    }
}

/// Why a connection was not accepted.
#[derive(Debug)]
pub(crate) enum Refused {
    /// Every open connection (of this address, or at all) is busy with a request.
    Busy,
}

impl Connections {
    pub(crate) fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            table: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many connections are open.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().open.len()
    }

    /// Admits a new connection from `ip`, shedding an idle one if a cap is reached (see the
    /// module docs).
    pub(crate) fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Connection, Refused> {
        let peer = Peer::from(ip);
        let mut table = self.lock();
        if table.unauthenticated.get(&peer).copied().unwrap_or(0) >= self.limits.max_per_address {
            let victim = table
                .open
                .iter()
                .find(|(_, c)| c.peer == peer && !c.authenticated && c.idle())
                .map(|(id, _)| *id);
            match victim {
                Some(id) => table.shed(id),
                None => {
                    metrics::connection_closed(ConnectionClosed::Refused);
                    return Err(Refused::Busy);
                }
            }
        }
        if table.open.len() >= self.limits.max_connections {
            let victim = table
                .open
                .iter()
                .find(|(_, c)| !c.authenticated && c.idle())
                .or_else(|| table.open.iter().find(|(_, c)| c.idle()))
                .map(|(id, _)| *id);
            match victim {
                Some(id) => table.shed(id),
                None => {
                    metrics::connection_closed(ConnectionClosed::Refused);
                    return Err(Refused::Busy);
                }
            }
        }
        let id = table.next;
        table.next += 1;
        let now = Instant::now();
        let close = CancellationToken::new();
        table.open.insert(
            id,
            Conn {
                peer,
                accepted: now,
                last_active: now,
                requests: 0,
                in_flight: 0,
                authenticated: false,
                close: close.clone(),
            },
        );
        *table.unauthenticated.entry(peer).or_default() += 1;
        metrics::connection_opened();
        Ok(Connection {
            id,
            connections: self.clone(),
            close,
        })
    }

    /// Closes the connections past their time: no complete request head within the first
    /// request timeout, or idle between requests for the keep-alive timeout (not authenticated:
    /// the shorter of the two). Run every tick.
    pub(crate) fn sweep(&self) {
        let now = Instant::now();
        let mut table = self.lock();
        let expired: Vec<(u64, ConnectionClosed)> = table
            .open
            .iter()
            .filter(|(_, c)| c.idle())
            .filter_map(|(id, c)| {
                if c.requests == 0 {
                    (now.duration_since(c.accepted) >= self.limits.first_request)
                        .then_some((*id, ConnectionClosed::NoRequest))
                } else {
                    let limit = match c.authenticated {
                        true => self.limits.keep_alive,
                        false => self.limits.keep_alive.min(self.limits.first_request),
                    };
                    (now.duration_since(c.last_active) >= limit)
                        .then_some((*id, ConnectionClosed::Idle))
                }
            })
            .collect();
        for (id, why) in expired {
            if let Some(conn) = table.remove(id) {
                conn.close.cancel();
                metrics::connection_closed(why);
            }
        }
    }
}

impl Table {
    /// Forgets connection `id`; returns it if it was open.
    fn remove(&mut self, id: u64) -> Option<Conn> {
        let conn = self.open.remove(&id)?;
        if !conn.authenticated
            && let Some(n) = self.unauthenticated.get_mut(&conn.peer)
        {
            *n -= 1;
            if *n == 0 {
                self.unauthenticated.remove(&conn.peer);
            }
        }
        Some(conn)
    }

    /// Closes connection `id` to make room.
    fn shed(&mut self, id: u64) {
        if let Some(conn) = self.remove(id) {
            conn.close.cancel();
            metrics::connection_closed(ConnectionClosed::Shed);
        }
    }
}

/// One admitted connection; dropping it forgets the connection.
pub(crate) struct Connection {
    id: u64,
    connections: Arc<Connections>,
    close: CancellationToken,
}

impl Connection {
    /// Cancelled when the connection is to be closed (timed out or shed).
    pub(crate) fn closing(&self) -> CancellationToken {
        self.close.clone()
    }

    /// A request's head arrived; the connection is busy until the returned guard (held by the
    /// response body) is dropped.
    pub(crate) fn request(self: &Arc<Self>) -> InFlight {
        if let Some(conn) = self.connections.lock().open.get_mut(&self.id) {
            conn.requests += 1;
            conn.in_flight += 1;
            conn.last_active = Instant::now();
        }
        InFlight(self.clone())
    }

    /// A request on this connection carried an accepted credential.
    pub(crate) fn authenticated(&self) {
        let mut table = self.connections.lock();
        let Some(conn) = table.open.get_mut(&self.id) else {
            return;
        };
        if conn.authenticated {
            return;
        }
        conn.authenticated = true;
        let peer = conn.peer;
        if let Some(n) = table.unauthenticated.get_mut(&peer) {
            *n -= 1;
            if *n == 0 {
                table.unauthenticated.remove(&peer);
            }
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let removed = self.connections.lock().remove(self.id);
        if let Some(conn) = removed {
            // How long clients keep idle connections (the keep-alive timeout must exceed it).
            tracing::debug!(
                requests = conn.requests,
                open_ms = conn.accepted.elapsed().as_millis() as u64,
                idle_ms = conn.last_active.elapsed().as_millis() as u64,
                "connection ended"
            );
            metrics::connection_closed(ConnectionClosed::Ended);
        }
    }
}

/// A request in progress on a connection (see [`Connection::request`]).
pub(crate) struct InFlight(Arc<Connection>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(conn) = self.0.connections.lock().open.get_mut(&self.0.id) {
            conn.in_flight = conn.in_flight.saturating_sub(1);
            conn.last_active = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_connections: 6,
            max_per_address: 3,
            first_request: Duration::from_millis(50),
            keep_alive: Duration::from_millis(200),
        }
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn unauthenticated_connections_are_shed_first_and_busy_ones_never() {
        let c = Connections::new(limits());
        // One address: at most 3 unauthenticated; a 4th replaces the oldest.
        let a: Vec<_> = (0..3).map(|_| Arc::new(c.admit(ip(1)).unwrap())).collect();
        let a4 = c.admit(ip(1)).unwrap();
        assert!(a[0].closing().is_cancelled());
        assert!(!a[1].closing().is_cancelled());
        // An authenticated connection of that address no longer counts there.
        let _busy = a[1].request();
        a[1].authenticated();
        let _a5 = c.admit(ip(1)).unwrap();
        assert!(!a[1].closing().is_cancelled() && !a[2].closing().is_cancelled());
        assert_eq!(c.len(), 4);
        // The global cap: new ones get in by shedding the oldest idle unauthenticated one.
        let b1 = c.admit(ip(2)).unwrap();
        let b2 = c.admit(ip(3)).unwrap();
        assert_eq!(c.len(), 6);
        let b3 = c.admit(ip(4)).unwrap();
        assert!(
            a[2].closing().is_cancelled(),
            "the oldest unauthenticated idle one"
        );
        assert!(!a[1].closing().is_cancelled(), "busy: never shed");
        assert_eq!(c.len(), 6);
        drop((a4, b1, b2, b3));
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn refused_only_when_every_connection_is_busy() {
        let c = Connections::new(limits());
        let open: Vec<_> = (0..6)
            .map(|i| Arc::new(c.admit(ip(10 + i)).unwrap()))
            .collect();
        let busy: Vec<_> = open.iter().map(|conn| conn.request()).collect();
        assert!(matches!(c.admit(ip(99)), Err(Refused::Busy)));
        drop(busy);
        assert!(c.admit(ip(99)).is_ok());
    }

    #[test]
    fn silent_and_idle_connections_time_out_busy_ones_do_not() {
        let c = Connections::new(limits());
        let silent = Arc::new(c.admit(ip(1)).unwrap());
        let served = Arc::new(c.admit(ip(1)).unwrap());
        drop(served.request());
        served.authenticated();
        let anonymous = Arc::new(c.admit(ip(1)).unwrap());
        drop(anonymous.request());
        let busy = Arc::new(c.admit(ip(1)).unwrap());
        let _guard = busy.request();
        std::thread::sleep(Duration::from_millis(80));
        c.sweep();
        assert!(silent.closing().is_cancelled(), "sent nothing within 50 ms");
        assert!(
            anonymous.closing().is_cancelled(),
            "not authenticated: idle 50 ms at most"
        );
        assert!(
            !served.closing().is_cancelled(),
            "idle keep-alive is allowed 200 ms"
        );
        std::thread::sleep(Duration::from_millis(150));
        c.sweep();
        assert!(served.closing().is_cancelled());
        assert!(
            !busy.closing().is_cancelled(),
            "a request in progress is never cut"
        );
    }
}
