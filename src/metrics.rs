//! Process-wide counters of the MCP server, served by `ipybox serve --http` at `/metrics` in
//! the Prometheus text format (version 0.0.4): kernel sessions (open, created, closed by
//! reason, refused), cells (by outcome, with a latency histogram) and HTTP responses (by
//! status class, and refused credentials) and HTTP connections (open, closed by reason).
//!
//! Recording is a few atomic adds, so it is always on (the stdio server records too, and
//! nobody reads it). No label carries a session handle, a token or anything a client sent.
//!
//! Not here: serving the text (`crate::http`), what a session is.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How an `execute_ipython_cell` call ended.
#[derive(Debug, Clone, Copy)]
pub(crate) enum CellEnd {
    Ok,
    Error,
    InputRequired,
    Task,
    Cancelled,
}

/// Upper bounds (seconds) of the cell latency histogram's buckets.
const BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 300.0,
];

/// Why a kernel session was closed.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Closed {
    /// Idle for `--idle-timeout`.
    Idle,
    /// Its handshake-era MCP session ended (DELETE, or rmcp's keep-alive).
    McpSession,
    /// The server shut down.
    Shutdown,
    /// Its kernel is gone from the kernel gateway (another replica closed it, or the server
    /// lost it).
    Gone,
}

const CLOSED: [(&str, usize); 4] = [
    ("idle", 0),
    ("mcp_session", 1),
    ("shutdown", 2),
    ("gone", 3),
];

const CELLS: [&str; 5] = ["ok", "error", "input_required", "task", "cancelled"];

/// Why an HTTP connection was closed by ipybox, or refused.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ConnectionClosed {
    /// No complete request head within `--first-request-timeout`.
    NoRequest,
    /// Idle between requests for `--keep-alive-timeout`.
    Idle,
    /// Replaced by a new connection at a cap (an idle one, unauthenticated first).
    Shed,
    /// Not accepted: every connection at the cap was busy with a request.
    Refused,
    /// Ended by the client or after its last response.
    Ended,
}

const CONNECTIONS_CLOSED: [&str; 5] = ["no_request", "idle", "shed", "refused", "ended"];

struct Metrics {
    sessions_open: AtomicU64,
    sessions_created: AtomicU64,
    sessions_attached: AtomicU64,
    sessions_refused: AtomicU64,
    sessions_closed: [AtomicU64; 4],
    sessions_saved: AtomicU64,
    hibernations: AtomicU64,
    restores: AtomicU64,
    checkpoints: AtomicU64,
    saved_expired: AtomicU64,
    cells: [AtomicU64; 5],
    cell_buckets: [AtomicU64; BUCKETS.len()],
    cell_count: AtomicU64,
    cell_micros: AtomicU64,
    http: [AtomicU64; 5],
    unauthorized: AtomicU64,
    connections_open: AtomicU64,
    connections_closed: [AtomicU64; 5],
}

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);

static METRICS: Metrics = Metrics {
    sessions_open: ZERO,
    sessions_created: ZERO,
    sessions_attached: ZERO,
    sessions_refused: ZERO,
    sessions_closed: [ZERO; 4],
    sessions_saved: ZERO,
    hibernations: ZERO,
    restores: ZERO,
    checkpoints: ZERO,
    saved_expired: ZERO,
    cells: [ZERO; 5],
    cell_buckets: [ZERO; BUCKETS.len()],
    cell_count: ZERO,
    cell_micros: ZERO,
    http: [ZERO; 5],
    unauthorized: ZERO,
    connections_open: ZERO,
    connections_closed: [ZERO; 5],
};

fn add(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A `tools/call` of `execute_ipython_cell` ended `how` after `elapsed`.
pub(crate) fn cell(how: CellEnd, elapsed: Duration) {
    add(&METRICS.cells[how as usize]);
    let secs = elapsed.as_secs_f64();
    for (bound, bucket) in BUCKETS.iter().zip(&METRICS.cell_buckets) {
        if secs <= *bound {
            add(bucket);
        }
    }
    add(&METRICS.cell_count);
    METRICS.cell_micros.fetch_add(
        u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

/// A kernel session was created (`attached`: to a kernel another replica made).
pub(crate) fn session_opened(attached: bool) {
    add(&METRICS.sessions_open);
    add(if attached {
        &METRICS.sessions_attached
    } else {
        &METRICS.sessions_created
    });
}

/// A kernel session was closed.
pub(crate) fn session_closed(why: Closed) {
    METRICS.sessions_open.fetch_sub(1, Ordering::Relaxed);
    add(&METRICS.sessions_closed[why as usize]);
}

/// An idle session was hibernated: saved, its kernel stopped (it is no longer open).
pub(crate) fn session_hibernated() {
    METRICS.sessions_open.fetch_sub(1, Ordering::Relaxed);
    add(&METRICS.hibernations);
}

/// A saved session was restored into a new kernel (it is open again).
pub(crate) fn session_restored() {
    add(&METRICS.sessions_open);
    add(&METRICS.restores);
}

/// An open session was checkpointed (saved, kept open).
pub(crate) fn session_checkpointed() {
    add(&METRICS.checkpoints);
}

/// A saved session's snapshot was deleted (idle timeout, quota).
pub(crate) fn saved_session_expired() {
    add(&METRICS.saved_expired);
}

/// How many sessions are saved and not open (hibernated) now.
pub(crate) fn set_sessions_saved(n: u64) {
    METRICS.sessions_saved.store(n, Ordering::Relaxed);
}

/// A new session was refused (`--max-sessions`).
pub(crate) fn session_refused() {
    add(&METRICS.sessions_refused);
}

/// An HTTP response with `status` was sent.
pub(crate) fn http_response(status: u16) {
    let class = usize::from((status / 100).clamp(1, 5)) - 1;
    add(&METRICS.http[class]);
}

/// A request without a valid credential was refused.
pub(crate) fn unauthorized() {
    add(&METRICS.unauthorized);
}

/// An HTTP connection was accepted.
pub(crate) fn connection_opened() {
    add(&METRICS.connections_open);
}

/// An HTTP connection was closed (or, `Refused`, never accepted).
pub(crate) fn connection_closed(why: ConnectionClosed) {
    if !matches!(why, ConnectionClosed::Refused) {
        METRICS.connections_open.fetch_sub(1, Ordering::Relaxed);
    }
    add(&METRICS.connections_closed[why as usize]);
}

/// Everything, in the Prometheus text format.
pub(crate) fn render() -> String {
    use std::fmt::Write;
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    };
    metric(
        "ipybox_sessions",
        "gauge",
        "Kernel sessions open now.",
        &[(String::new(), get(&METRICS.sessions_open))],
    );
    metric(
        "ipybox_sessions_opened_total",
        "counter",
        "Kernel sessions opened: a new kernel, or attached to a kernel another replica made.",
        &[
            ("{how=\"new\"}".into(), get(&METRICS.sessions_created)),
            ("{how=\"attached\"}".into(), get(&METRICS.sessions_attached)),
        ],
    );
    metric(
        "ipybox_sessions_closed_total",
        "counter",
        "Kernel sessions closed, by reason.",
        &CLOSED.map(|(reason, i)| {
            (
                format!("{{reason=\"{reason}\"}}"),
                get(&METRICS.sessions_closed[i]),
            )
        }),
    );
    metric(
        "ipybox_sessions_hibernated",
        "gauge",
        "Sessions saved to disk with no kernel (they come back on their next call).",
        &[(String::new(), get(&METRICS.sessions_saved))],
    );
    metric(
        "ipybox_session_saves_total",
        "counter",
        "Session snapshots: hibernations (kernel stopped) and checkpoints (kept open).",
        &[
            ("{kind=\"hibernate\"}".into(), get(&METRICS.hibernations)),
            ("{kind=\"checkpoint\"}".into(), get(&METRICS.checkpoints)),
        ],
    );
    metric(
        "ipybox_session_restores_total",
        "counter",
        "Saved sessions restored into a new kernel.",
        &[(String::new(), get(&METRICS.restores))],
    );
    metric(
        "ipybox_saved_sessions_expired_total",
        "counter",
        "Saved sessions deleted (--idle-timeout, --snapshot-quota).",
        &[(String::new(), get(&METRICS.saved_expired))],
    );
    metric(
        "ipybox_sessions_refused_total",
        "counter",
        "New kernel sessions refused because --max-sessions were open.",
        &[(String::new(), get(&METRICS.sessions_refused))],
    );
    let cells: Vec<(String, u64)> = CELLS
        .iter()
        .zip(&METRICS.cells)
        .map(|(outcome, c)| (format!("{{outcome=\"{outcome}\"}}"), get(c)))
        .collect();
    metric(
        "ipybox_cells_total",
        "counter",
        "execute_ipython_cell calls, by how they ended.",
        &cells,
    );
    let _ = writeln!(
        out,
        "# HELP ipybox_cell_seconds Time from an execute_ipython_cell request to its answer.\n# TYPE ipybox_cell_seconds histogram"
    );
    for (bound, bucket) in BUCKETS.iter().zip(&METRICS.cell_buckets) {
        let _ = writeln!(
            out,
            "ipybox_cell_seconds_bucket{{le=\"{bound}\"}} {}",
            get(bucket)
        );
    }
    let count = get(&METRICS.cell_count);
    let _ = writeln!(out, "ipybox_cell_seconds_bucket{{le=\"+Inf\"}} {count}");
    let _ = writeln!(
        out,
        "ipybox_cell_seconds_sum {}",
        get(&METRICS.cell_micros) as f64 / 1e6
    );
    let _ = writeln!(out, "ipybox_cell_seconds_count {count}");
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    };
    let http: Vec<(String, u64)> = ["1xx", "2xx", "3xx", "4xx", "5xx"]
        .iter()
        .zip(&METRICS.http)
        .map(|(class, c)| (format!("{{status=\"{class}\"}}"), get(c)))
        .collect();
    metric(
        "ipybox_http_responses_total",
        "counter",
        "HTTP responses, by status class.",
        &http,
    );
    metric(
        "ipybox_http_unauthorized_total",
        "counter",
        "HTTP requests refused for a missing or wrong bearer token.",
        &[(String::new(), get(&METRICS.unauthorized))],
    );
    metric(
        "ipybox_http_connections",
        "gauge",
        "HTTP connections open now.",
        &[(String::new(), get(&METRICS.connections_open))],
    );
    let closed: Vec<(String, u64)> = CONNECTIONS_CLOSED
        .iter()
        .zip(&METRICS.connections_closed)
        .map(|(reason, c)| (format!("{{reason=\"{reason}\"}}"), get(c)))
        .collect();
    metric(
        "ipybox_http_connections_closed_total",
        "counter",
        "HTTP connections closed (refused: never accepted), by reason.",
        &closed,
    );
    out
}
