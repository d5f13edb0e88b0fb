//! One run of `execute_ipython_cell`, driven by a task of its own so that it can outlive the
//! request that started it: a 2026-07-28 client answers approvals in a *later* request
//! ([`super::mrtr`]), and a long cell can become a task that `tasks/get` polls
//! ([`super::tasks`]).
//!
//! The driver consumes the executor's stream at once, whoever listens: the end of the output
//! (the last [`WINDOW`] bytes) is kept here for progress notifications and a task's status, the
//! output itself is in the result (held within the request's and the server's caps by the
//! executor), tool calls the user allowed for the session are accepted
//! on the spot, and the others wait in [`CellRun::take_unasked`] until whoever serves the run
//! asks the user (elicitation/create, an `input_required` round, or the task's
//! `input_required` status). Every change bumps a version that waiters watch.
//!
//! Not here: how the user is asked, or what the result looks like to the client.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ipybox::executor::{Canceller, Execution, ExecutionEvent, ExecutionResult, ExecutorError};
use ipybox::tools::ApprovalRequest;
use tokio::sync::watch;

use super::elicit::SessionAllowances;

/// How much of the output the run keeps (its end) for progress and status messages, which show
/// at most the last thousand characters; a waiter that fell further behind gets what is left.
/// Kept in a buffer trimmed once it is twice this, so appending stays linear.
pub(crate) const WINDOW: usize = 64 * 1024;

/// A cell being executed, shared by the requests (or the task) that serve it.
#[derive(Clone)]
pub(crate) struct CellRun {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    /// Bumped on every change of `state`.
    version: watch::Sender<u64>,
    canceller: Canceller,
    started: Instant,
}

#[derive(Default)]
struct State {
    /// The end of what was printed so far (at least the last [`WINDOW`] bytes).
    output: String,
    /// Bytes printed before `output` starts.
    dropped: usize,
    /// Approval requests nobody has been asked about yet.
    unasked: Vec<ApprovalRequest>,
    /// The result, once the cell has ended; taken by whoever answers the client.
    result: Option<Result<ExecutionResult, ExecutorError>>,
    /// Whether the cell has ended (the result may have been taken since).
    ended: bool,
}

/// What a waiter sees of a run at one moment.
pub(crate) struct Snapshot {
    /// Output printed since the offset the waiter passed.
    pub(crate) new_output: String,
    /// The offset to pass next time.
    pub(crate) offset: usize,
    /// How many approval requests nobody has been asked about yet.
    pub(crate) unasked: usize,
    pub(crate) ended: bool,
}

impl CellRun {
    /// Starts driving `execution`: from now on its events are consumed whether or not anybody
    /// waits. Approvals of calls in `allowances` are accepted without asking. `guard` is held
    /// until the cell has ended (its session counts as in use meanwhile).
    pub(crate) fn start(
        mut execution: Execution,
        allowances: SessionAllowances,
        guard: CellGuard,
    ) -> Self {
        let inner = Arc::new(Inner {
            state: Mutex::default(),
            version: watch::channel(0).0,
            canceller: execution.canceller(),
            started: Instant::now(),
        });
        let driven = inner.clone();
        // The driver logs within the request's span (the session, over HTTP).
        let span = tracing::Span::current();
        tokio::spawn(tracing::Instrument::instrument(
            async move {
                while let Some(event) = execution.next().await {
                    let mut state = driven.lock();
                    match event {
                        ExecutionEvent::Chunk(text) => state.push(&text),
                        ExecutionEvent::Image(_) => continue,
                        ExecutionEvent::Approval(request) => {
                            if allowances.allows(&request) {
                                request.accept_remembered();
                                continue;
                            }
                            state.unasked.push(request);
                        }
                        ExecutionEvent::Result(result) => {
                            state.result = Some(result);
                            state.ended = true;
                        }
                    }
                    drop(state);
                    driven.version.send_modify(|v| *v += 1);
                }
                let mut state = driven.lock();
                if !state.ended {
                    state.result = Some(Err(ipybox::kernel::KernelError::Stopped.into()));
                    state.ended = true;
                }
                // Requests that arrived after the end have nobody to ask: dropped, so rejected.
                state.unasked.clear();
                drop(state);
                drop(guard);
                driven.version.send_modify(|v| *v += 1);
            },
            span,
        ));
        Self { inner }
    }

    /// A receiver that sees every later change (`changed()`), for `tokio::select!`.
    pub(crate) fn watch(&self) -> watch::Receiver<u64> {
        self.inner.version.subscribe()
    }

    /// The state now, with the output printed after `offset` (as much of it as is still kept).
    pub(crate) fn snapshot(&self, offset: usize) -> Snapshot {
        let state = self.inner.lock();
        let end = state.dropped + state.output.len();
        let mut from = offset.clamp(state.dropped, end) - state.dropped;
        while !state.output.is_char_boundary(from) {
            from += 1;
        }
        Snapshot {
            new_output: state.output[from..].to_string(),
            offset: end,
            unasked: state.unasked.len(),
            ended: state.ended,
        }
    }

    /// The last `max_chars` characters of the output so far (for a task's status message).
    pub(crate) fn output_tail(&self, max_chars: usize) -> String {
        let state = self.inner.lock();
        match state.output.char_indices().rev().nth(max_chars) {
            Some((at, c)) => state.output[at + c.len_utf8()..].to_string(),
            None => state.output.clone(),
        }
    }

    /// The approval requests nobody was asked about yet; the caller now owns asking (a request
    /// dropped unanswered is rejected).
    pub(crate) fn take_unasked(&self) -> Vec<ApprovalRequest> {
        std::mem::take(&mut self.inner.lock().unasked)
    }

    /// The result, once the cell has ended (once: the first caller gets it).
    pub(crate) fn take_result(&self) -> Option<Result<ExecutionResult, ExecutorError>> {
        self.inner.lock().result.take()
    }

    /// Interrupts the cell (state kept); its waiting approvals are rejected. The result becomes
    /// [`ExecutorError::Cancelled`].
    pub(crate) fn cancel(&self) {
        self.inner.canceller.cancel();
    }

    /// How long the cell has been running.
    pub(crate) fn elapsed(&self) -> std::time::Duration {
        self.inner.started.elapsed()
    }
}

impl State {
    fn push(&mut self, text: &str) {
        self.output.push_str(text);
        if self.output.len() >= 2 * WINDOW {
            let mut cut = self.output.len() - WINDOW;
            while !self.output.is_char_boundary(cut) {
                cut += 1;
            }
            self.output.drain(..cut);
            self.dropped += cut;
        }
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A running cell, counted by its session while it lives (see
/// `KernelSession::cell_running`).
pub(crate) struct CellGuard(Arc<AtomicUsize>);

impl CellGuard {
    /// Counts one more running cell in `cells` until dropped.
    pub(crate) fn new(cells: Arc<AtomicUsize>) -> Self {
        cells.fetch_add(1, Ordering::SeqCst);
        Self(cells)
    }
}

impl Drop for CellGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
