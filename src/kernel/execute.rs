//! One execution on a ready kernel: send `execute_request`, assemble outputs, decide when it is
//! complete, and handle timeouts and kernel death.
//!
//! Complete means: iopub reported `status: idle` for our msg_id AND the shell `execute_reply`
//! arrived. Output that arrives before idle is therefore never dropped, whatever its size.
//! On timeout the kernel is interrupted over the control channel; if it does not come back within
//! the grace period, the caller must replace it (see [`super::pool`]). The timeout can be paused
//! (while a tool call waits for an approval decision) through [`TimeoutPause`]. Completion is
//! decided by [`Completion`] (idle AND reply).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jupyter_protocol::{ExecuteRequest, JupyterMessage, JupyterMessageContent, ReplyStatus};
use tokio::sync::{mpsc, watch};

use super::completion::Completion;
use super::instance::Kernel;
use super::output::{OutputCollector, bounded, strip_ansi};
use super::{KernelConfig, KernelError};
use crate::pause::TimeoutPause;

/// Something an execution produced while it runs, in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ExecEvent {
    /// Text output: stdout, stderr, or the text/plain of a result or display.
    Output(Source, String),
    /// An image written to the images directory, and its bytes (as the kernel sent them).
    Image(Source, PathBuf, Vec<u8>),
}

/// Which kind of Jupyter output an [`ExecEvent`] came from (the session notebook keeps them
/// apart; the text a caller gets does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    Stdout,
    Stderr,
    /// An `execute_result` (the value of the cell's last expression).
    Result,
    /// A `display_data` or `update_display_data`.
    Display,
}

/// The result of a successful execution.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExecutionOutput {
    /// Everything printed, in order, stripped of surrounding whitespace; no colour codes.
    pub text: String,
    /// Images written by the execution (`<images_dir>/<8 hex>.png`).
    pub images: Vec<PathBuf>,
    /// The PNG bytes of each of `images`, in the same order, as the kernel sent them. Use these
    /// instead of reading the files back: the images directory is in the workspace, where code
    /// in a sandboxed kernel can replace a file (even with a link to a file it cannot read).
    pub image_data: Vec<Vec<u8>>,
    /// Images the execution displayed beyond the executor's image limits
    /// ([`CodeExecutorBuilder::max_images`](crate::executor::CodeExecutorBuilder::max_images),
    /// [`max_image_bytes`](crate::executor::CodeExecutorBuilder::max_image_bytes)): neither
    /// saved nor in `images`.
    pub images_dropped: usize,
}

/// A timeout budget that only runs while not paused.
struct Clock {
    budget: Option<Duration>,
    running_since: Option<Instant>,
    paused: watch::Receiver<usize>,
}

impl Clock {
    fn new(timeout: Option<Duration>, mut paused: watch::Receiver<usize>) -> Self {
        let running = *paused.borrow_and_update() == 0;
        Self {
            budget: timeout,
            running_since: running.then(Instant::now),
            paused,
        }
    }

    fn update(&mut self) {
        let paused = *self.paused.borrow_and_update() > 0;
        match (paused, self.running_since) {
            (true, Some(since)) => {
                self.budget = self.budget.map(|b| b.saturating_sub(since.elapsed()));
                self.running_since = None;
            }
            (false, None) => self.running_since = Some(Instant::now()),
            _ => {}
        }
    }

    fn deadline(&self) -> Option<Instant> {
        Some(self.running_since? + self.budget?)
    }
}

/// An exception's type, message and traceback lines.
type ErrorParts = (String, String, Vec<String>);

/// How an execution ended, and whether the kernel must be replaced before the next one.
pub(crate) struct Outcome {
    pub result: Result<ExecutionOutput, KernelError>,
    pub replace_kernel: bool,
}

/// Runs `code` on `kernel`. `timeout` of `None` waits forever; `text_cap` caps the text kept
/// below the config's own limit.
pub(crate) async fn run(
    kernel: &mut Kernel,
    config: &KernelConfig,
    code: &str,
    timeout: Option<Duration>,
    events: Option<&mpsc::UnboundedSender<ExecEvent>>,
    pause: &TimeoutPause,
    text_cap: Option<usize>,
) -> Outcome {
    let request = ExecuteRequest {
        code: code.to_string(),
        silent: false,
        store_history: true,
        user_expressions: None,
        allow_stdin: false,
        stop_on_error: true,
    };
    let limits = config.output.with_text_cap(text_cap);
    run_request(kernel, config, request, timeout, events, pause, limits).await
}

/// Runs ipybox's own `code` (a snapshot or a restore) silently: not in the history, no execution
/// count, no post-cell hooks; otherwise like [`run`].
pub(crate) async fn run_hidden(
    kernel: &mut Kernel,
    config: &KernelConfig,
    code: &str,
    timeout: Option<Duration>,
    pause: &TimeoutPause,
) -> Outcome {
    let request = ExecuteRequest {
        code: code.to_string(),
        silent: true,
        store_history: false,
        user_expressions: None,
        allow_stdin: false,
        stop_on_error: true,
    };
    run_request(kernel, config, request, timeout, None, pause, config.output).await
}

/// Runs ipybox's own setup `code` on a new kernel (silently, outside the history); its failure
/// is a start error.
pub(crate) async fn bootstrap(
    kernel: &mut Kernel,
    config: &KernelConfig,
    code: &str,
) -> Result<(), KernelError> {
    let request = ExecuteRequest {
        code: code.to_string(),
        silent: true,
        store_history: false,
        user_expressions: None,
        allow_stdin: false,
        stop_on_error: true,
    };
    let pause = TimeoutPause::default();
    let outcome = run_request(kernel, config, request, None, None, &pause, config.output).await;
    outcome.result.map(|_| ()).map_err(|e| KernelError::Start {
        reason: format!("ipybox's setup cell failed in the new kernel: {e}"),
        help:
            "the kernel needs Python >= 3.9 with ipykernel; check the Jupyter server's kernelspec"
                .into(),
    })
}

async fn run_request(
    kernel: &mut Kernel,
    config: &KernelConfig,
    request: ExecuteRequest,
    timeout: Option<Duration>,
    events: Option<&mpsc::UnboundedSender<ExecEvent>>,
    pause: &TimeoutPause,
    limits: super::output::OutputLimits,
) -> Outcome {
    let mut out = OutputCollector::new(&config.images_dir, limits);
    if let Some(status) = kernel.exited() {
        log_death(kernel, &status);
        return died(status, out, false);
    }
    let request: JupyterMessage = request.into();
    let msg_id = request.header.msg_id.clone();
    let mut done = Completion::new(msg_id.clone());
    // If the caller drops this future before the execution completes, the kernel is still
    // running the code: record it so the next use of the kernel interrupts it first.
    let mut guard = AbandonGuard {
        slot: kernel.abandoned.clone(),
        msg_id: Some(msg_id),
    };
    if let Err(e) = kernel.send_shell(request).await {
        guard.msg_id = None;
        // A kernel that has just died refuses messages before its end is known (a forked
        // kernel's status comes from its template, a moment later): report the death, not the
        // refused message.
        let mut exit = kernel.exit_watch();
        let ended = tokio::time::timeout(Duration::from_secs(1), exit.wait_for(Option::is_some));
        if matches!(ended.await, Ok(Ok(_))) {
            let status = kernel.exited().unwrap_or_else(|| "exited".into());
            log_death(kernel, &status);
            return died(status, out, false);
        }
        return Outcome {
            result: Err(e),
            replace_kernel: true,
        };
    }

    let emit = |event: ExecEvent| {
        if let Some(tx) = events {
            let _ = tx.send(event);
        }
    };
    let mut exit = kernel.exit_watch();
    let mut clock = Clock::new(timeout, pause.subscribe());
    let mut error: Option<ErrorParts> = None;
    let mut interrupted_at: Option<Instant> = None;

    while !done.is_complete() {
        // One timer: the (pausable) timeout, then, once it fired, the interrupt's grace period.
        let timer = match interrupted_at {
            None => clock.deadline(),
            Some(at) => Some(at + config.interrupt_grace),
        };
        tokio::select! {
            Some(msg) = kernel.iopub_rx.recv() => {
                if !done.on_iopub(&msg) {
                    continue;
                }
                match msg.content {
                    JupyterMessageContent::StreamContent(s) => {
                        let chunk = out.push_stream(&s.text);
                        if !chunk.is_empty() {
                            let source = match s.name {
                                jupyter_protocol::Stdio::Stdout => Source::Stdout,
                                jupyter_protocol::Stdio::Stderr => Source::Stderr,
                            };
                            emit(ExecEvent::Output(source, chunk));
                        }
                    }
                    JupyterMessageContent::ExecuteResult(r) => emit_media(&mut out, &r.data, Source::Result, &emit),
                    JupyterMessageContent::DisplayData(d) => emit_media(&mut out, &d.data, Source::Display, &emit),
                    JupyterMessageContent::UpdateDisplayData(d) => emit_media(&mut out, &d.data, Source::Display, &emit),
                    JupyterMessageContent::ErrorOutput(e) => error = Some((e.ename, e.evalue, e.traceback)),
                    _ => {}
                }
            }
            Some(msg) = kernel.shell_rx.recv() => done.on_shell(msg),
            _ = exit.changed() => {
                // Collect what already arrived, then report the death.
                tokio::time::sleep(Duration::from_millis(20)).await;
                while let Ok(msg) = kernel.iopub_rx.try_recv() {
                    if let (true, JupyterMessageContent::StreamContent(s)) = (done.is_ours(&msg), &msg.content) {
                        out.push_stream(&s.text);
                    }
                }
                let status = kernel.exited().unwrap_or_else(|| "exited".into());
                log_death(kernel, &status);
                guard.msg_id = None;
                return died(status, out, true);
            }
            changed = clock.paused.changed() => {
                if changed.is_ok() {
                    clock.update();
                }
            }
            () = sleep_until(timer) => {
                if interrupted_at.is_none() {
                    tracing::info!("execution timed out; interrupting the kernel");
                    interrupted_at = Some(Instant::now());
                    if let Err(e) = kernel.interrupt().await {
                        tracing::warn!("interrupt failed: {e}");
                    }
                } else {
                    tracing::warn!("kernel did not stop after an interrupt; it will be restarted");
                    guard.msg_id = None;
                    return Outcome {
                        result: Err(KernelError::Timeout { seconds: secs(timeout), state_kept: false, output: out.text() }),
                        replace_kernel: true,
                    };
                }
            }
        }
    }

    guard.msg_id = None;
    outcome(out, &done, error, interrupted_at.is_some(), timeout, limits)
}

/// What an execution that completed (or was interrupted in time) returns: its output, the
/// kernel's error (from iopub, else its reply), or a timeout with the kernel's state kept.
fn outcome(
    out: OutputCollector,
    done: &Completion,
    error: Option<ErrorParts>,
    interrupted: bool,
    timeout: Option<Duration>,
    limits: super::output::OutputLimits,
) -> Outcome {
    let (text, images, image_data, images_dropped) = out.finish();
    if interrupted {
        return Outcome {
            result: Err(KernelError::Timeout {
                seconds: secs(timeout),
                state_kept: true,
                output: text,
            }),
            replace_kernel: false,
        };
    }
    let (status, reply_error) = match done.reply() {
        Some(JupyterMessageContent::ExecuteReply(r)) => (
            r.status.clone(),
            r.error
                .as_ref()
                .map(|e| (e.ename.clone(), e.evalue.clone(), e.traceback.clone())),
        ),
        // A reply of another type for an execute request: a broken kernel.
        _ => (ReplyStatus::Error, None),
    };
    let failure = match status {
        ReplyStatus::Ok => None,
        ReplyStatus::Error => {
            error
                .or(reply_error)
                .or(Some(("Error".into(), "execution failed".into(), vec![])))
        }
        ReplyStatus::Aborted => Some((
            "ExecutionAborted".into(),
            "the kernel aborted the execution".into(),
            vec![],
        )),
    };
    let result = match failure {
        None => Ok(ExecutionOutput {
            text,
            images,
            image_data,
            images_dropped,
        }),
        // The kernel's words, as long as it likes: held within the output's limit too.
        Some((ename, evalue, traceback)) => Err(KernelError::Failed {
            traceback: bounded(
                format_traceback(&ename, &evalue, &traceback),
                limits.max_text_bytes,
            ),
            ename: bounded(ename, limits.max_text_bytes.map(|m| m.min(1024))),
            evalue: bounded(strip_ansi(&evalue), limits.max_text_bytes),
            output: text,
        }),
    };
    Outcome {
        result,
        replace_kernel: false,
    }
}

/// Sleeps until `deadline`; without one, never wakes.
pub(crate) async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Records an unfinished execution's msg_id in the kernel when dropped while armed.
struct AbandonGuard {
    slot: Arc<std::sync::Mutex<Option<String>>>,
    msg_id: Option<String>,
}

impl Drop for AbandonGuard {
    fn drop(&mut self) {
        if let Some(id) = self.msg_id.take() {
            *self.slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(id);
        }
    }
}

/// If an execution was abandoned by its caller, interrupts it and waits (up to the interrupt
/// grace) until the kernel reports it finished. Returns false if the kernel must be replaced.
pub(crate) async fn settle_abandoned(kernel: &mut Kernel, config: &KernelConfig) -> bool {
    let Some(msg_id) = kernel
        .abandoned
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
    else {
        return true;
    };
    tracing::info!("interrupting an execution whose caller went away");
    if kernel.exited().is_some() || kernel.interrupt().await.is_err() {
        return false;
    }
    let mut done = Completion::new(msg_id);
    let grace = tokio::time::sleep(config.interrupt_grace);
    tokio::pin!(grace);
    let mut exit = kernel.exit_watch();
    while !done.is_complete() {
        tokio::select! {
            Some(msg) = kernel.iopub_rx.recv() => {
                done.on_iopub(&msg);
            }
            Some(msg) = kernel.shell_rx.recv() => done.on_shell(msg),
            _ = exit.changed() => return false,
            _ = &mut grace => return false,
        }
    }
    true
}

fn emit_media(
    out: &mut OutputCollector,
    media: &jupyter_protocol::Media,
    source: Source,
    emit: &impl Fn(ExecEvent),
) {
    let (text, image) = out.push_media(media);
    if let Some(text) = text {
        emit(ExecEvent::Output(source, text));
    }
    if let Some(path) = image {
        let bytes = out.last_image_bytes().to_vec();
        emit(ExecEvent::Image(source, path, bytes));
    }
}

fn secs(timeout: Option<Duration>) -> f64 {
    timeout.map_or(0.0, |t| t.as_secs_f64())
}

/// The kernel's last stderr lines go to the log: a crash (a segfault in an extension, a fatal
/// Python error) explains itself there, not in the cell's output.
fn log_death(kernel: &Kernel, status: &str) {
    // Both may be the kernel's own words (a hostile kernel's): quoted and escaped, one line.
    tracing::warn!(status = ?status, stderr = ?kernel.stderr_tail(), "the kernel died");
}

fn died(status: String, out: OutputCollector, ran: bool) -> Outcome {
    Outcome {
        result: Err(KernelError::Died {
            status,
            output: out.text(),
            ran,
        }),
        replace_kernel: true,
    }
}

/// The traceback as plain text; IPython's lines already end with the `ename: evalue` line.
fn format_traceback(ename: &str, evalue: &str, traceback: &[String]) -> String {
    let text = strip_ansi(&traceback.join("\n"));
    let text = text.trim();
    if text.is_empty() {
        format!("{ename}: {}", strip_ansi(evalue))
    } else {
        text.to_string()
    }
}
