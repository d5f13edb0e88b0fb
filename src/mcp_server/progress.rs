//! Progress of a running cell, for a `tools/call` that carries a `progressToken`: output lines
//! become `notifications/progress` messages while the cell runs, so a client shows life during a
//! long cell. The final result is unchanged.
//!
//! Rate-limited: output is gathered and sent at most every [`INTERVAL`] (complete lines only,
//! the last [`MAX_MESSAGE_CHARS`] characters of them); a cell that prints nothing reports
//! `running for N s` every [`HEARTBEAT`]. `progress` is the seconds since the cell started, so
//! it increases with every notification; there is no `total`.

use std::time::{Duration, Instant};

use rmcp::RoleServer;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::Peer;

/// At most one notification per this long.
pub(crate) const INTERVAL: Duration = Duration::from_millis(250);
/// A silent cell still reports this often.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(5);
/// The longest message (characters; the end of the output is kept).
const MAX_MESSAGE_CHARS: usize = 1000;
/// Pending output kept (bytes): far more than a message shows, trimmed to half when over.
const MAX_PENDING: usize = 64 * 1024;

/// Sends the progress notifications of one execution.
pub(crate) struct ProgressReporter {
    peer: Peer<RoleServer>,
    token: ProgressToken,
    started: Instant,
    last_sent: Instant,
    /// Output not yet sent; only complete lines are sent while the cell runs.
    pending: String,
    last_progress: f64,
}

impl ProgressReporter {
    pub(crate) fn new(peer: Peer<RoleServer>, token: ProgressToken) -> Self {
        let now = Instant::now();
        Self {
            peer,
            token,
            started: now,
            last_sent: now - INTERVAL,
            pending: String::new(),
            last_progress: 0.0,
        }
    }

    /// Output arrived.
    pub(crate) async fn output(&mut self, text: &str) {
        self.pending.push_str(text);
        // Only the end of what is pending is ever sent: output without newlines holds no more.
        if self.pending.len() > MAX_PENDING {
            let mut cut = self.pending.len() - MAX_PENDING / 2;
            while !self.pending.is_char_boundary(cut) {
                cut += 1;
            }
            self.pending.drain(..cut);
        }
        self.flush(false).await;
    }

    /// When [`ProgressReporter::tick`] should be called next.
    pub(crate) fn next_tick(&self) -> Instant {
        if self.pending.contains('\n') {
            self.last_sent + INTERVAL
        } else {
            self.last_sent + HEARTBEAT
        }
    }

    /// The cell ended: sends the output not sent yet (before the result goes out).
    pub(crate) async fn finish(&mut self) {
        self.flush(true).await;
    }

    /// Sends what is due: pending lines after the interval, a heartbeat after silence.
    pub(crate) async fn tick(&mut self) {
        if !self.flush(false).await && self.last_sent.elapsed() >= HEARTBEAT {
            let message = format!("running for {} s", self.started.elapsed().as_secs());
            self.send(message).await;
        }
    }

    /// Sends the complete lines gathered so far (all of it with `everything`), if the interval
    /// allows; returns whether a notification was sent.
    async fn flush(&mut self, everything: bool) -> bool {
        if self.last_sent.elapsed() < INTERVAL && !everything {
            return false;
        }
        let end = if everything {
            self.pending.len()
        } else {
            match self.pending.rfind('\n') {
                Some(i) => i + 1,
                None => return false,
            }
        };
        if end == 0 {
            return false;
        }
        let lines: String = self.pending.drain(..end).collect();
        let lines = lines.trim_end_matches('\n');
        let skip = lines.chars().count().saturating_sub(MAX_MESSAGE_CHARS);
        let message: String = lines.chars().skip(skip).collect();
        self.send(message).await;
        true
    }

    async fn send(&mut self, message: String) {
        // Strictly increasing, also when two notifications fall in the same millisecond.
        let progress = (self.started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
        let progress = progress.max(self.last_progress + 0.001);
        self.last_progress = progress;
        self.last_sent = Instant::now();
        let param =
            ProgressNotificationParam::new(self.token.clone(), progress).with_message(message);
        if let Err(e) = self.peer.notify_progress(param).await {
            tracing::debug!("progress notification not sent: {e}");
        }
    }
}
