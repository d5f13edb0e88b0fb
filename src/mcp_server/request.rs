//! One `execute_ipython_cell` request, in either MCP era: it waits on the cell's [`CellRun`]
//! and ends in one of four ways ([`Outcome`]):
//!
//! - the cell ended: its result;
//! - the client cancelled the request (`notifications/cancelled`): the cell is interrupted,
//!   the kernel keeps its state;
//! - 2026-07-28 with `--approve ask`: the cell waits for approvals, so the request answers
//!   `input_required` and the run is parked until the retry ([`super::mrtr`]); approvals that
//!   arrive together (threads, `asyncio.gather`) go into the same round: the round closes once
//!   no new one came for [`GATHER_QUIET`] (at most [`GATHER_MAX`] after the first);
//! - the request declared the tasks extension and the cell outlived `--task-after`: the run
//!   becomes a task ([`super::tasks`]).
//!
//! Handshake-era clients are asked with `elicitation/create` while the request is open
//! ([`super::elicit::decide`], one task per approval: concurrent calls are asked about
//! concurrently and output keeps flowing). A request with a progress token gets the output as
//! `notifications/progress` ([`super::progress`]), in both eras; the reporter is settled
//! (consumed) before any answer is returned, so no notification follows an answer.
//!
//! Not here: the tool's arguments and result text (the tool in [`super`]).

use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::{InputRequiredResult, Task};
use rmcp::service::RequestContext;
use tokio::time::Instant;

use ipybox::executor::{ExecutionResult, ExecutorError};

use super::cell::CellRun;
use super::mrtr::{RoundId, Rounds};
use super::progress::ProgressReporter;
use super::session::KernelSession;
use super::tasks::{Adopt, CellTasks, Finish};
use super::{ApproveMode, ServerConfig, elicit};

/// A round of approvals closes when no new approval arrived for this long: concurrent calls
/// (threads, `asyncio.gather`) reach the host within a millisecond or two of each other on a
/// quiet machine, but 3 ms was seen to split eight of them at load 3 on 2 cores; a cell with a
/// single call pays only this much for the gathering (nothing beside a person's answer).
pub(crate) const GATHER_QUIET: Duration = Duration::from_millis(20);
/// ... and at the latest this long after its first approval.
pub(crate) const GATHER_MAX: Duration = Duration::from_millis(100);

/// How one request for a cell ends.
pub(crate) enum Outcome {
    Done(Result<ExecutionResult, ExecutorError>),
    /// The client cancelled the request; the cell was interrupted.
    Cancelled,
    /// The run is parked until the client retries with the user's answers.
    InputRequired(InputRequiredResult),
    /// The run became a task.
    Task(Task),
}

/// What serving a request needs of the server.
pub(crate) struct Serve<'a> {
    pub(crate) config: &'a ServerConfig,
    /// The kernel session the cell runs in.
    pub(crate) session: &'a std::sync::Arc<KernelSession>,
    pub(crate) rounds: &'a std::sync::Arc<Rounds>,
    pub(crate) tasks: &'a CellTasks,
    pub(crate) context: &'a RequestContext<RoleServer>,
    /// The call's arguments (a retry must carry the same).
    pub(crate) binding: &'a [u8],
    /// The cell's own timeout (a task lives this long plus `--task-ttl`).
    pub(crate) timeout: Duration,
}

/// Before a request is answered: no progress notification after the answer, none just before it
/// ([`ProgressReporter::settle`]).
async fn settle(progress: Option<ProgressReporter>) {
    if let Some(p) = progress {
        p.settle().await;
    }
}

/// Whether this request speaks a revision without server-to-client requests (2026-07-28 on).
fn stateless(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|v| !v.has_initialize())
}

/// Whether the client of this request can be asked in form mode: from the request's `_meta` on
/// 2026-07-28, from `initialize` before.
fn can_elicit(context: &RequestContext<RoleServer>) -> bool {
    if stateless(context) {
        context
            .client_capabilities()
            .and_then(|c| c.elicitation)
            .is_some_and(|e| e.form.is_some() || e.url.is_none())
    } else {
        context
            .peer
            .supported_elicitation_modes()
            .contains(&rmcp::service::ElicitationMode::Form)
    }
}

impl Serve<'_> {
    /// Serves `run` (round `resumed` of a parked run, or a new one) until one of the outcomes.
    /// `finish` turns the result into the tool's result if the run becomes a task.
    pub(crate) async fn serve(
        &self,
        run: CellRun,
        resumed: Option<RoundId>,
        finish: impl FnOnce() -> Finish,
    ) -> Outcome {
        let context = self.context;
        let ask = self.config.approve == ApproveMode::Ask;
        let stateless = stateless(context);
        let can_elicit = can_elicit(context);
        let mut progress = context
            .meta
            .get_progress_token()
            .map(|t| ProgressReporter::new(context.peer.clone(), t));
        let task_at = match self.config.task_after {
            Some(after)
                if context
                    .client_capabilities()
                    .is_some_and(|c| c.supports_tasks()) =>
            {
                Some(Instant::now() + after)
            }
            _ => None,
        };
        let adopt = |run: CellRun, finish: Finish| {
            Outcome::Task(self.tasks.adopt(
                &self.session.busy,
                &self.session.owner,
                Adopt {
                    run,
                    ttl: self.timeout.saturating_add(self.config.task_ttl),
                    can_elicit: ask && can_elicit,
                    allowances: self.session.allowances.clone(),
                    finish,
                },
            ))
        };
        // `--task-after 0`: every cell is a task, however quick (a new call; a resumed round is
        // resolved first).
        if task_at.is_some() && self.config.task_after == Some(Duration::ZERO) && resumed.is_none()
        {
            return adopt(run, finish());
        }
        let mut deciding = tokio::task::JoinSet::new();
        let mut gather_until: Option<Instant> = None;
        let mut gather_started: Option<Instant> = None;
        let mut gathered = 0;
        let mut changes = run.watch();
        // A resumed run's earlier output went out as progress of the earlier round (and is in the
        // final result anyway): report what is new since.
        let mut offset = match resumed {
            Some(_) => run.snapshot(usize::MAX).offset,
            None => 0,
        };
        let far = || Instant::now() + Duration::from_secs(3600);
        loop {
            let now = run.snapshot(offset);
            offset = now.offset;
            if let Some(p) = progress.as_mut() {
                p.output(&now.new_output).await;
            }
            if now.ended {
                settle(progress.take()).await;
                return Outcome::Done(
                    run.take_result()
                        .unwrap_or_else(|| Err(ipybox::kernel::KernelError::Stopped.into())),
                );
            }
            if now.unasked > 0 && ask {
                if !can_elicit {
                    for request in run.take_unasked() {
                        elicit::log_unasked(&request);
                        request.reject_with(elicit::NO_ELICITATION);
                    }
                } else if stateless {
                    if now.unasked != gathered {
                        // A new approval: the round stays open a little longer.
                        gathered = now.unasked;
                        let first = *gather_started.get_or_insert_with(Instant::now);
                        gather_until =
                            Some((Instant::now() + GATHER_QUIET).min(first + GATHER_MAX));
                    }
                } else {
                    for request in run.take_unasked() {
                        let (peer, allowances) =
                            (context.peer.clone(), self.session.allowances.clone());
                        let approval_timeout = self.config.approval_timeout;
                        deciding.spawn(async move {
                            elicit::decide(request, &peer, &allowances, approval_timeout).await;
                        });
                    }
                }
            }
            let tick = progress.as_ref().map_or_else(far, |p| p.next_tick().into());
            // Not while the user is being asked: a round is resolved before a task is made.
            let task_due = task_at.filter(|_| gather_until.is_none() && deciding.is_empty());
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        settle(progress.take()).await;
                        return Outcome::Done(Err(ipybox::kernel::KernelError::Stopped.into()));
                    }
                }
                () = tokio::time::sleep_until(tick) => {
                    if let Some(p) = progress.as_mut() {
                        p.tick().await;
                    }
                }
                () = tokio::time::sleep_until(gather_until.unwrap_or_else(far)), if gather_until.is_some() => {
                    let asking = run.take_unasked();
                    if asking.is_empty() {
                        // The cell ended meanwhile (its leftover requests are rejected).
                        (gather_until, gather_started, gathered) = (None, None, 0);
                        continue;
                    }
                    settle(progress.take()).await;
                    return Outcome::InputRequired(
                        self.rounds.park(resumed, run, asking, self.binding, self.session),
                    );
                }
                () = tokio::time::sleep_until(task_due.unwrap_or_else(far)), if task_due.is_some() => {
                    settle(progress.take()).await;
                    return adopt(run, finish());
                }
                Some(_) = deciding.join_next(), if !deciding.is_empty() => {}
                () = context.ct.cancelled() => {
                    run.cancel();
                    return Outcome::Cancelled;
                }
            }
        }
    }
}
