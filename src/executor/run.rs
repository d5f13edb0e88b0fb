//! The cell driver: `execute` (all tool calls accepted), `stream` (output, images and approval
//! requests as they arrive, then the result), `cancel`; what one execution's options are
//! (`RunOptions`), its handle (`Execution`, `Canceller`), how it ends when its caller goes away
//! or the executor stops, and its record in the session notebook. Not here: how the kernel runs
//! the code and assembles output (`crate::kernel::execute`), approval policies
//! (`crate::tools::approval`).

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{CodeExecutor, ExecutionResult, ExecutorError, Inner, Running};
use crate::kernel::{ExecEvent, ExecutionOutput, KernelError};
use crate::notebook::{CellRecord, Ending, Notebook};
use crate::pause::TimeoutPause;
use crate::tools::{ApprovalPolicy, ApprovalRequest, CallLog};
// Named in doc links only.
#[cfg(doc)]
use super::CodeExecutorBuilder;

/// One item of [`CodeExecutor::stream`].
#[derive(Debug)]
pub enum ExecutionEvent {
    /// Output text as it arrives.
    Chunk(String),
    /// An image file written by the execution.
    Image(PathBuf),
    /// A tool call (or, with `approve_shell_cmds`, a shell command) waiting for
    /// [`ApprovalRequest::accept`] or [`ApprovalRequest::reject`].
    Approval(ApprovalRequest),
    /// The final result; always the last item.
    Result(Result<ExecutionResult, ExecutorError>),
}

/// Armed while an `execute()` runs; if that future is dropped, settles the abandoned execution
/// (interrupt, or replace the kernel) as soon as the executor's lock is free.
struct SettleOnDrop(Option<Arc<Inner>>);

impl Drop for SettleOnDrop {
    fn drop(&mut self) {
        if let Some(inner) = self.0.take()
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            handle.spawn(async move {
                if let Some(running) = inner.state.lock().await.as_mut() {
                    running.pool.settle().await;
                }
            });
        }
    }
}

/// Registered while an execution holds the executor's lock: [`CodeExecutor::cancel`] reaches it.
/// Dropping it unregisters.
struct CurrentExecution<'a>(&'a Inner);

impl<'a> CurrentExecution<'a> {
    fn register(inner: &'a Inner, canceller: Canceller) -> Self {
        *inner.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(canceller);
        Self(inner)
    }
}

impl Drop for CurrentExecution<'_> {
    fn drop(&mut self) {
        self.0
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }
}

impl Inner {
    /// The executor's lock, for an execution: `None` if a stop begins while it waits (a stop
    /// never waits behind queued executions, which would only fail once it is done).
    async fn lock_unless_stopping(&self) -> Option<tokio::sync::MutexGuard<'_, Option<Running>>> {
        let mut stopping = self.stopping.subscribe();
        tokio::select! {
            biased;
            guard = self.state.lock() => Some(guard),
            _ = stopping.wait_for(|s| *s) => None,
        }
    }

    /// Runs `execution` unless `stop()` is called meanwhile.
    async fn unless_stopping(
        &self,
        execution: impl std::future::Future<Output = Result<ExecutionOutput, KernelError>>,
    ) -> Result<ExecutionOutput, KernelError> {
        let mut stopping = self.stopping.subscribe();
        tokio::select! {
            result = execution => result,
            _ = stopping.wait_for(|s| *s) => Err(KernelError::Stopped),
        }
    }
}

impl CodeExecutor {
    /// Runs `code` and returns its output; its tool calls are all accepted. `timeout` of `None`
    /// waits as long as it takes.
    pub async fn execute(
        &self,
        code: &str,
        timeout: Option<Duration>,
    ) -> Result<ExecutionResult, ExecutorError> {
        self.execute_inner(code, timeout, true).await
    }

    /// [`Self::execute`]; `record`: whether the session notebook gets the cell (ipybox's own
    /// housekeeping code is not the session's).
    pub(super) async fn execute_inner(
        &self,
        code: &str,
        timeout: Option<Duration>,
        record: bool,
    ) -> Result<ExecutionResult, ExecutorError> {
        let mut state = self
            .inner
            .lock_unless_stopping()
            .await
            .ok_or(KernelError::Stopped)?;
        let running = state.as_mut().ok_or(KernelError::Stopped)?;
        running.pristine = false;
        let (cancel, mut cancelled) = tokio::sync::watch::channel(false);
        let _current = CurrentExecution::register(&self.inner, Canceller(Arc::new(cancel)));
        // Recorded when this future ends, also when its caller drops it (as cancelled).
        let options = RunOptions {
            timeout,
            ..RunOptions::default()
        };
        let mut recording = record
            .then(|| Recording::start(&self.inner, code, &options))
            .flatten()
            .map(|(recording, cell)| {
                let (tx, rx) = mpsc::unbounded_channel();
                RecordOnDrop(Some((recording, cell, rx)), tx)
            });
        // This execution's own clock: only its calls' approval waits pause it.
        let pause = TimeoutPause::default();
        let log = recording
            .as_ref()
            .and_then(|r| r.0.as_ref())
            .map(|(recording, ..)| recording.log.clone())
            .unwrap_or_default();
        running
            .tools
            .state()
            .set_policy(ApprovalPolicy::AcceptAll, pause.clone(), log);
        // If our caller drops this future mid-execution, interrupt the code right away instead
        // of letting it run on (the next execution would otherwise wait behind it).
        let mut settle = SettleOnDrop(Some(self.inner.clone()));
        let events = recording.as_ref().map(|r| &r.1);
        let run = running.pool.execute(code, timeout, events, &pause, None);
        let mut result = tokio::select! {
            result = self.inner.unless_stopping(run) => result.map_err(ExecutorError::from),
            true = async { cancelled.wait_for(|c| *c).await.is_ok() } => {
                running.pool.settle().await;
                Err(ExecutorError::Cancelled)
            }
        };
        note_limits(running, &mut result);
        settle.0 = None;
        if let Some(recording) = recording.as_mut() {
            recording.finish(&result);
        }
        result
    }

    /// Cancels the execution that is running now (from [`CodeExecutor::execute`] or
    /// [`CodeExecutor::stream`]), as [`Canceller::cancel`] does: the kernel is interrupted
    /// (state kept), tool calls waiting for approval are rejected (a later `accept()` runs
    /// nothing), and the execution ends with [`ExecutorError::Cancelled`]. Returns whether an
    /// execution was running. An execution still waiting for its turn is not affected.
    pub fn cancel(&self) -> bool {
        let current = self
            .inner
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match current {
            Some(canceller) => {
                canceller.cancel();
                true
            }
            None => false,
        }
    }

    /// Runs `code`, yielding output chunks, images and approval requests as they arrive, then the
    /// result. Each tool call waits until its [`ApprovalRequest`] is accepted or rejected (or the
    /// approval timeout passes). The execution runs to completion even if the stream is dropped
    /// early; its pending and later tool calls are then rejected.
    pub fn stream(&self, code: &str, timeout: Option<Duration>) -> Execution {
        self.stream_with_options(
            code,
            RunOptions {
                timeout,
                ..RunOptions::default()
            },
        )
    }

    /// [`CodeExecutor::stream`] whose tool calls (and shell commands) are all accepted, as in
    /// [`CodeExecutor::execute`]: output chunks and images as they arrive, no
    /// [`ExecutionEvent::Approval`] items.
    pub fn stream_accepting(&self, code: &str, timeout: Option<Duration>) -> Execution {
        self.stream_with_options(
            code,
            RunOptions {
                timeout,
                accept_all: true,
                ..RunOptions::default()
            },
        )
    }

    /// [`CodeExecutor::stream`] (or, with [`RunOptions::accept_all`],
    /// [`CodeExecutor::stream_accepting`]) with every option of one execution: its timeout, a
    /// lower cap on the text it keeps, what the session notebook keeps.
    pub fn stream_with_options(&self, code: &str, options: RunOptions) -> Execution {
        let ask = !options.accept_all;
        let timeout = options.timeout;
        let max_output_bytes = options.max_output_bytes;
        let (tx, rx) = mpsc::unbounded_channel();
        let (cancel, mut cancelled) = tokio::sync::watch::channel(false);
        let canceller = Canceller(Arc::new(cancel));
        let inner = self.inner.clone();
        let code = code.to_string();
        let registered = canceller.clone();
        tokio::spawn(async move {
            let (recording, mut cell) = Recording::start(&inner, &code, &options).unzip();
            let log = recording
                .as_ref()
                .map(|r| r.log.clone())
                .unwrap_or_default();
            let (ev_tx, mut ev_rx) = mpsc::unbounded_channel::<ExecEvent>();
            let forward = {
                let tx = tx.clone();
                tokio::spawn(async move {
                    while let Some(ev) = ev_rx.recv().await {
                        if let Some(cell) = cell.as_mut() {
                            cell.observe(&ev);
                        }
                        let _ = tx.send(match ev {
                            ExecEvent::Output(_, s) => ExecutionEvent::Chunk(s),
                            ExecEvent::Image(_, p, _) => ExecutionEvent::Image(p),
                        });
                    }
                    cell
                })
            };
            // Cancelled when the execution ends: waiting tool calls are then rejected, and the
            // forwarder below stops (a call still waiting holds a sender, so the channel alone
            // would not close while the application holds an undecided request).
            let ended = CancellationToken::new();
            let (ap_tx, mut ap_rx) = mpsc::unbounded_channel::<ApprovalRequest>();
            let approvals = {
                let tx = tx.clone();
                let ended = ended.clone();
                tokio::spawn(async move {
                    loop {
                        let request = tokio::select! {
                            biased;
                            request = ap_rx.recv() => request,
                            () = ended.cancelled() => ap_rx.try_recv().ok(),
                        };
                        let Some(request) = request else { break };
                        // If the stream was dropped the request is dropped too: rejected.
                        let _ = tx.send(ExecutionEvent::Approval(request));
                    }
                })
            };
            // Held until the notebook has the cell: the next execution's cell comes after it.
            let mut state = inner.lock_unless_stopping().await;
            let result = {
                let _current = CurrentExecution::register(&inner, registered);
                match state.as_mut().and_then(|s| s.as_mut()) {
                    Some(running) => {
                        running.pristine = false;
                        // This execution's own clock: only its calls' approval waits pause it.
                        let pause = TimeoutPause::default();
                        // Waits end (rejected) when this execution is cancelled, not when it
                        // merely ends: a leftover thread's request stays the application's to
                        // decide.
                        let waits = CancellationToken::new();
                        let policy = if ask {
                            ApprovalPolicy::ask(ap_tx, waits.clone())
                        } else {
                            // No requests: the forwarder must see its channel close.
                            drop(ap_tx);
                            ApprovalPolicy::AcceptAll
                        };
                        running
                            .tools
                            .state()
                            .set_policy(policy.clone(), pause.clone(), log);
                        let run = running.pool.execute(
                            &code,
                            timeout,
                            Some(&ev_tx),
                            &pause,
                            max_output_bytes,
                        );
                        let mut result = tokio::select! {
                            result = inner.unless_stopping(run) => result.map_err(ExecutorError::from),
                            true = async { cancelled.wait_for(|c| *c).await.is_ok() } => {
                                // Reject what waits for a decision (the kernel's call then
                                // returns), interrupt the code, and wait until the kernel is
                                // idle (or replace it) before the next execution runs.
                                waits.cancel();
                                running.pool.settle().await;
                                Err(ExecutorError::Cancelled)
                            }
                        };
                        note_limits(running, &mut result);
                        // Calls made after this execution (leftover threads) have no one to ask
                        // (accepting executions accept them, as execute() does).
                        if ask {
                            running.tools.state().set_policy(
                                ApprovalPolicy::ask(
                                    mpsc::unbounded_channel().0,
                                    CancellationToken::new(),
                                ),
                                TimeoutPause::default(),
                                CallLog::default(),
                            );
                        }
                        result
                    }
                    None => Err(KernelError::Stopped.into()),
                }
            };
            drop(ev_tx);
            ended.cancel();
            let (cell, _) = tokio::join!(forward, approvals);
            // The result goes out first, then the notebook gets the cell (reads of it wait),
            // still before the next execution runs (`state` is held until then).
            let recorded = match (recording, cell) {
                (Some(recording), Ok(Some(cell))) => Recording::ending(&result)
                    .map(|ending| (recording.notebook.expect(), recording, cell, ending)),
                _ => None,
            };
            let _ = tx.send(ExecutionEvent::Result(result));
            if let Some((expected, recording, cell, ending)) = recorded {
                recording.record(cell, &ending);
                drop(expected);
            }
            drop(state);
        });
        Execution {
            rx,
            cancel: canceller,
        }
    }
}

/// The options of one execution ([`CodeExecutor::stream_with_options`]).
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Interrupt the code after this long (`None`: wait as long as it takes).
    pub timeout: Option<Duration>,
    /// Accept every tool call and shell command, as [`CodeExecutor::stream_accepting`] does,
    /// instead of yielding approval requests.
    pub accept_all: bool,
    /// Keep at most this many bytes of text output (below the executor's own
    /// [`CodeExecutorBuilder::max_output_bytes`], if any), its first and last halves.
    pub max_output_bytes: Option<usize>,
    /// The session notebook keeps at most this many characters of the cell's text: a caller
    /// that passes on only so much (the MCP tool's `max_output_chars`) says so here, and the
    /// notebook holds what the caller got. Default: [`crate::notebook::MAX_CELL_TEXT_CHARS`].
    pub notebook_output_chars: Option<usize>,
}

/// One execution's place in the session notebook: where its approval decisions are recorded,
/// and the notebook that gets the cell when it ends.
struct Recording {
    notebook: Arc<Notebook>,
    log: CallLog,
}

impl Recording {
    /// `None` when the executor keeps no notebook.
    fn start(inner: &Inner, code: &str, options: &RunOptions) -> Option<(Self, CellRecord)> {
        let notebook = inner.notebook.clone()?;
        let cell = CellRecord::new(code, options.timeout, options.notebook_output_chars);
        Some((
            Self {
                notebook,
                log: CallLog::recording(),
            },
            cell,
        ))
    }

    /// Gives the notebook the cell (unless it never ran: the executor was stopped).
    fn finish(self, cell: CellRecord, result: &Result<ExecutionResult, ExecutorError>) {
        if let Some(ending) = Self::ending(result) {
            self.record(cell, &ending);
        }
    }

    /// How the execution that returned `result` ended, for the notebook (`None`: it never
    /// ran, the executor was stopped).
    fn ending(result: &Result<ExecutionResult, ExecutorError>) -> Option<Ending> {
        Some(match result {
            Ok(_) => Ending::Ok,
            Err(ExecutorError::Kernel(KernelError::Stopped)) => return None,
            Err(ExecutorError::Kernel(e)) => Ending::kernel(e),
            Err(e @ ExecutorError::Cancelled) => Ending::cancelled(e.to_string()),
            Err(e) => Ending::other(e.to_string()),
        })
    }

    /// Gives the notebook the cell, which ended as `ending`.
    fn record(self, cell: CellRecord, ending: &Ending) {
        self.notebook.finish(cell, ending, self.log.take());
    }
}

/// An `execute()`'s recording: the execution's events arrive on the channel (its sender is the
/// second field); recorded when finished, or as cancelled when dropped before (its caller went
/// away).
struct RecordOnDrop(
    Option<(Recording, CellRecord, mpsc::UnboundedReceiver<ExecEvent>)>,
    mpsc::UnboundedSender<ExecEvent>,
);

impl RecordOnDrop {
    fn finish(&mut self, result: &Result<ExecutionResult, ExecutorError>) {
        if let Some((recording, mut cell, mut events)) = self.0.take() {
            while let Ok(event) = events.try_recv() {
                cell.observe(&event);
            }
            recording.finish(cell, result);
        }
    }
}

impl Drop for RecordOnDrop {
    fn drop(&mut self) {
        self.finish(&Err(ExecutorError::Cancelled));
    }
}

/// The items of one [`CodeExecutor::stream`] call. Use [`Execution::next`] or the `Stream` impl.
#[derive(Debug)]
pub struct Execution {
    rx: mpsc::UnboundedReceiver<ExecutionEvent>,
    cancel: Canceller,
}

/// Cancels one streamed execution from anywhere (another task, a signal handler's task).
#[derive(Debug, Clone)]
pub struct Canceller(Arc<tokio::sync::watch::Sender<bool>>);

impl Canceller {
    /// Interrupts the execution: its result becomes [`ExecutorError::Cancelled`] once the kernel
    /// is idle again (state kept). Does nothing after the execution has finished.
    pub fn cancel(&self) {
        self.0.send_replace(true);
    }
}

impl Execution {
    /// A handle that cancels this execution while its items are being awaited elsewhere.
    pub fn canceller(&self) -> Canceller {
        self.cancel.clone()
    }

    /// The next item; `None` after the result.
    pub async fn next(&mut self) -> Option<ExecutionEvent> {
        self.rx.recv().await
    }

    /// Drains the stream and returns the result.
    pub async fn result(mut self) -> Result<ExecutionResult, ExecutorError> {
        while let Some(ev) = self.rx.recv().await {
            if let ExecutionEvent::Result(r) = ev {
                return r;
            }
        }
        Err(KernelError::Stopped.into())
    }
}

impl futures::Stream for Execution {
    type Item = ExecutionEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

/// Adds to `result` which of its session's limits the cell met (a confined session's cgroup
/// counters, its work directory's tmpfs): a line the model reads, naming the limit and its flag.
/// A kernel killed for memory says so in its "kernel died" error.
fn note_limits(running: &Running, result: &mut Result<ExecutionResult, ExecutorError>) {
    let Some(session) = &running.session else {
        return;
    };
    let hits = session.hits();
    if hits.is_empty() {
        return;
    }
    let notes = hits.iter().map(|h| h.note()).collect::<Vec<_>>().join("\n");
    let append = |text: &mut String| {
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        text.push_str(&notes);
    };
    match result {
        Ok(output) => append(&mut output.text),
        Err(ExecutorError::Kernel(KernelError::Died { status, output, .. })) => {
            if let Some(crate::confine::limits::LimitHit::Memory(n)) = hits
                .iter()
                .find(|h| matches!(h, crate::confine::limits::LimitHit::Memory(_)))
            {
                *status = format!(
                    "killed for memory: this session reached its memory limit, {}, --session-memory",
                    crate::confine::limits::format_bytes(*n)
                );
            }
            // Printed before the error ("kernel died (…) — restarted, state lost").
            append(output);
        }
        Err(ExecutorError::Kernel(KernelError::Failed { traceback, .. })) => append(traceback),
        Err(ExecutorError::Kernel(KernelError::Timeout { output, .. })) => append(output),
        Err(_) => {}
    }
}
