//! Long cells as tasks (the tasks extension, SEP-2663, `io.modelcontextprotocol/tasks`). When a
//! request declares the extension, a cell still running after `--task-after` seconds (default
//! 5; 0: at once) stops holding the request: `tools/call` answers with a task
//! (`resultType: "task"`) and the cell runs on. `tasks/get` reports `working` with the last
//! lines of output so far as the status message, `input_required` with one elicitation per
//! approval the cell waits for (answered with `tasks/update`, same questions and `remember` box
//! as elicitation/create), and finally `completed` with the same result a plain call returns.
//! `tasks/cancel` interrupts the cell and keeps the kernel's state (`cancelled`).
//!
//! One kernel runs one cell at a time. While a task's cell runs, `execute_ipython_cell` and
//! `install_package` answer at once with an error that names the task (rather than waiting
//! behind it for minutes), `reset` cancels the task first, `register_mcp_server` works as usual.
//!
//! A task and its result live for the cell's timeout plus `--task-ttl` (default 300 s) from its
//! creation; a finished task's result stays available for at least `--task-ttl` after it ended
//! ([`TaskManager`]'s retention), then `tasks/get` says the task is unknown.
//!
//! Over HTTP one server holds many kernel sessions: tasks are listed in one [`CellTasks`] per
//! server, each task readable only with the credential ([`Caller`]) that started it (another's
//! task id is answered as unknown); which task holds a kernel is per session ([`Busy`]).
//!
//! Not here: when a call becomes a task (the request loop in [`super`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolResult, ElicitRequest, ElicitResult, ElicitationAction, InputRequest, Task,
};
use rmcp::task_manager::{TaskContext, TaskExit, TaskManager, TaskOptions};

use super::cell::CellRun;
use super::elicit::{self, SessionAllowances};
use super::session::Caller;

/// The longest status message (the end of the output so far).
const STATUS_CHARS: usize = 1000;
/// The polling interval suggested to clients.
const POLL_INTERVAL_MS: u64 = 250;

/// The tasks of one server, and whose they are.
#[derive(Clone, Default)]
pub(crate) struct CellTasks {
    manager: TaskManager,
    owners: Arc<Mutex<HashMap<String, Caller>>>,
}

/// The task whose cell holds one session's kernel.
#[derive(Clone, Default)]
pub(crate) struct Busy {
    running: Arc<Mutex<Option<(String, CellRun)>>>,
}

/// How a task's cell turns into the task's result.
pub(crate) type Finish = Box<
    dyn FnOnce(
            Result<ipybox::executor::ExecutionResult, ipybox::executor::ExecutorError>,
        )
            -> std::pin::Pin<Box<dyn std::future::Future<Output = CallToolResult> + Send>>
        + Send,
>;

/// What a task needs besides its run.
pub(crate) struct Adopt {
    pub(crate) run: CellRun,
    /// The task's time to live.
    pub(crate) ttl: Duration,
    /// Whether the client can answer approvals (it declared form-mode elicitation).
    pub(crate) can_elicit: bool,
    pub(crate) allowances: SessionAllowances,
    pub(crate) finish: Finish,
}

impl Busy {
    /// The task whose cell runs now, with how long it has been running.
    pub(crate) fn busy(&self) -> Option<(String, Duration)> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running
            .as_ref()
            .filter(|(_, run)| !run.snapshot(usize::MAX).ended)
            .map(|(id, run)| (id.clone(), run.elapsed()))
    }

    /// The error a call gets while a task's cell runs.
    pub(crate) fn busy_error(&self) -> Option<String> {
        self.busy().map(|(id, elapsed)| {
            format!(
                "the kernel is busy: task {id} has been running a cell for {} s\n  help: poll it with tasks/get, stop it with tasks/cancel (the kernel keeps its state) or reset, or call again when it has finished",
                elapsed.as_secs()
            )
        })
    }

    /// Cancels the running task (as `tasks/cancel` does) and waits until its cell has ended
    /// (for `reset`).
    pub(crate) async fn cancel_running(&self, tasks: &CellTasks) {
        let running = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some((id, run)) = running {
            if tasks.manager.cancel_task(&id).is_err() {
                run.cancel(); // the task is gone already (expired): stop its cell anyway
            }
            wait_ended(&run).await;
        }
    }
}

impl CellTasks {
    /// Makes `adopt.run` a task of `owner` that holds `busy`'s kernel; returns its seed state
    /// for `CreateTaskResult`.
    pub(crate) fn adopt(&self, busy: &Busy, owner: &Caller, adopt: Adopt) -> Task {
        let Adopt {
            run,
            ttl,
            can_elicit,
            allowances,
            finish,
        } = adopt;
        let options = TaskOptions::new()
            .with_ttl_ms(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
            .with_poll_interval_ms(POLL_INTERVAL_MS)
            .with_status_message(status(&run));
        let running = busy.running.clone();
        let driven = run.clone();
        let task = self.manager.spawn(options, move |ctx| {
            Box::pin(async move {
                // rmcp drops this future when the task's TTL passes: the cell stops too.
                let guard = CancelOnDrop(Some(driven.clone()));
                let outcome = drive(&driven, &ctx, can_elicit, &allowances).await;
                let result = driven.take_result();
                drop(guard.disarm());
                match (outcome, result) {
                    (Drive::Cancelled, _) => Err(TaskExit::Cancelled),
                    (Drive::Ended, Some(result)) => Ok(finish(result).await),
                    (Drive::Ended, None) => Err(TaskExit::Error(rmcp::ErrorData::internal_error(
                        "the cell's result was taken twice (a bug: please report it)",
                        None,
                    ))),
                }
            })
        });
        *running.lock().unwrap_or_else(|p| p.into_inner()) = Some((task.task_id.clone(), run));
        let mut owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        // Tasks past their time to live are gone from the manager: forget their owners too.
        owners.retain(|id, _| self.manager.get_task(id).is_ok());
        owners.insert(task.task_id.clone(), owner.clone());
        task
    }

    /// The task manager, for a request of `caller` about `task_id`: another credential's task
    /// is answered as unknown, as a task that never existed.
    pub(crate) fn manager_for(
        &self,
        caller: &Caller,
        task_id: &str,
    ) -> Result<&TaskManager, rmcp::ErrorData> {
        let owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        match owners.get(task_id) {
            Some(owner) if owner == caller => Ok(&self.manager),
            // The manager's own answer for a task it does not have.
            _ => Err(rmcp::ErrorData::invalid_params(
                format!("unknown task: {task_id}"),
                None,
            )),
        }
    }
}

enum Drive {
    Ended,
    Cancelled,
}

/// Serves a task's run until the cell ends or the task is cancelled: status messages with the
/// output so far, approvals as the task's input requests.
async fn drive(
    run: &CellRun,
    ctx: &TaskContext,
    can_elicit: bool,
    allowances: &SessionAllowances,
) -> Drive {
    let mut changes = run.watch();
    let mut asked = 0u64;
    let mut offset = 0;
    loop {
        let now = run.snapshot(offset);
        if now.offset != offset {
            offset = now.offset;
            ctx.set_status_message(status(run));
        }
        if now.ended {
            return Drive::Ended;
        }
        for request in run.take_unasked() {
            if !can_elicit {
                elicit::log_unasked(&request);
                request.reject_with(elicit::NO_ELICITATION);
                continue;
            }
            let key = format!("approval-{asked}");
            asked += 1;
            let question =
                InputRequest::Elicitation(ElicitRequest::new(elicit::elicitation(&request)));
            let ctx = ctx.clone();
            let allowances = allowances.clone();
            tokio::spawn(async move {
                match ctx.request_input(key, question).await {
                    Ok(answer) => {
                        let answer = serde_json::from_value::<ElicitResult>(answer)
                            .unwrap_or_else(|_| ElicitResult::new(ElicitationAction::Cancel));
                        elicit::answer(request, &answer, &allowances);
                    }
                    Err(_) => request.reject_with("the task was cancelled"),
                }
            });
        }
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return Drive::Ended;
                }
            }
            () = ctx.cancelled() => {
                run.cancel();
                wait_ended(run).await;
                return Drive::Cancelled;
            }
        }
    }
}

/// Waits until `run`'s cell has ended.
async fn wait_ended(run: &CellRun) {
    let mut changes = run.watch();
    while !run.snapshot(usize::MAX).ended {
        if changes.changed().await.is_err() {
            return;
        }
    }
}

/// A task's status message: the end of the output so far, or how long the cell has run.
fn status(run: &CellRun) -> String {
    let tail = run.output_tail(STATUS_CHARS);
    if tail.trim().is_empty() {
        format!("running for {} s", run.elapsed().as_secs())
    } else {
        tail
    }
}

/// Cancels the run when dropped armed (the task's future was aborted).
struct CancelOnDrop(Option<CellRun>);

impl CancelOnDrop {
    fn disarm(mut self) -> Self {
        self.0 = None;
        self
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(run) = self.0.take() {
            run.cancel();
        }
    }
}
