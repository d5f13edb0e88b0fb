//! Progress of a running cell, for a `tools/call` that carries a `progressToken`: output lines
//! become `notifications/progress` messages while the cell runs, so a client shows life during a
//! long cell. The final result is unchanged: it carries the whole output, so output that was not
//! sent as progress yet is not sent as progress at all.
//!
//! Rate-limited: nothing in a cell's first [`INTERVAL`] (a quick cell sends no progress at all),
//! then at most one message every [`INTERVAL`] (complete lines only, the last
//! [`MAX_MESSAGE_CHARS`] characters of them); a cell that prints nothing reports
//! `running for N s` every [`HEARTBEAT`]. `progress` is the seconds since the cell started, so
//! it increases with every notification; there is no `total`.
//!
//! **Nothing after the result, nothing just before it.** The reporter is consumed by
//! [`ProgressReporter::settle`] before the request's answer (its result, an `input_required`
//! result, a task) is returned, so no notification can follow it; and `settle` holds the answer
//! until [`QUIET_BEFORE_RESULT`] has passed since the last notification. Clients built on the
//! TypeScript MCP SDK (Claude Code) handle a notification in a microtask but a response at once:
//! a notification read together with its request's response finds its token gone ("Received a
//! progress notification for an unknown token"), which Claude Code counts as a transport error.

use std::time::{Duration, Instant};

use rmcp::RoleServer;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::Peer;

/// At most one notification per this long, and none in a cell's first interval.
pub(crate) const INTERVAL: Duration = Duration::from_millis(250);
/// A silent cell still reports this often.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(5);
/// The answer to a request goes out at least this long after its last progress notification.
pub(crate) const QUIET_BEFORE_RESULT: Duration = Duration::from_millis(100);
/// The longest message (characters; the end of the output is kept).
const MAX_MESSAGE_CHARS: usize = 1000;
/// Pending output kept (bytes): far more than a message shows, trimmed to half when over.
const MAX_PENDING: usize = 64 * 1024;

/// Sends the progress notifications of one execution.
pub(crate) struct ProgressReporter {
    peer: Peer<RoleServer>,
    token: ProgressToken,
    started: Instant,
    /// When the last notification was sent (written to the transport: rmcp answers
    /// `notify_progress` once the message is written).
    last_sent: Option<Instant>,
    /// Output not yet sent; only complete lines are sent.
    pending: String,
    last_progress: f64,
}

impl ProgressReporter {
    pub(crate) fn new(peer: Peer<RoleServer>, token: ProgressToken) -> Self {
        Self {
            peer,
            token,
            started: Instant::now(),
            last_sent: None,
            pending: String::new(),
            last_progress: 0.0,
        }
    }

    /// The earliest moment the next notification may go out.
    fn allowed_at(&self) -> Instant {
        self.last_sent.unwrap_or(self.started) + INTERVAL
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
        self.flush().await;
    }

    /// When [`ProgressReporter::tick`] should be called next.
    pub(crate) fn next_tick(&self) -> Instant {
        if self.pending.contains('\n') {
            self.allowed_at()
        } else {
            self.last_sent.unwrap_or(self.started) + HEARTBEAT
        }
    }

    /// Sends what is due: pending lines after the interval, a heartbeat after silence.
    pub(crate) async fn tick(&mut self) {
        let since = self.last_sent.unwrap_or(self.started);
        if !self.flush().await && since.elapsed() >= HEARTBEAT {
            let message = format!("running for {} s", self.started.elapsed().as_secs());
            self.send(message).await;
        }
    }

    /// The request is about to be answered: sends nothing more (the answer carries the output)
    /// and returns once [`QUIET_BEFORE_RESULT`] has passed since the last notification.
    pub(crate) async fn settle(self) {
        if let Some(last) = self.last_sent {
            tokio::time::sleep_until((last + QUIET_BEFORE_RESULT).into()).await;
        }
    }

    /// Sends the complete lines gathered so far, if the interval allows; returns whether a
    /// notification was sent.
    async fn flush(&mut self) -> bool {
        if Instant::now() < self.allowed_at() {
            return false;
        }
        let end = match self.pending.rfind('\n') {
            Some(i) => i + 1,
            None => return false,
        };
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
        let param =
            ProgressNotificationParam::new(self.token.clone(), progress).with_message(message);
        if let Err(e) = self.peer.notify_progress(param).await {
            tracing::debug!("progress notification not sent: {e}");
        }
        self.last_sent = Some(Instant::now());
    }
}
