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
//! A task is created with a time to live of its cell's timeout plus `--task-ttl` (default
//! 300 s), long enough for the cell to run out its timeout. Once the cell has ended, its result
//! is kept for `--task-ttl`, whatever the client asked for its timeout, then forgotten
//! (`tasks/get` says the task is unknown); from then on `tasks/get` reports the task's time to
//! live as what it became (SEP-2663 lets it change). Each task has a [`TaskManager`] of its own,
//! so forgetting a task frees its result at once: rmcp's manager would keep a finished task for
//! its whole time to live again, and only notices on its next call.
//!
//! Over HTTP one server holds many kernel sessions: tasks are listed in one [`CellTasks`] per
//! server, each task readable only with the credential ([`Caller`]) that started it (another's
//! task id is answered as unknown); which task holds a kernel is per session ([`Busy`]).
//!
//! Not here: when a call becomes a task (the request loop in [`super`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolResult, DetailedTask, ElicitRequest, ElicitResult, ElicitationAction, InputRequest,
    Task,
};
use rmcp::task_manager::{TaskContext, TaskExit, TaskManager, TaskOptions};

use super::caller::Caller;
use super::cell::CellRun;
use super::elicit::{self, SessionAllowances};

/// The longest status message (the end of the output so far).
const STATUS_CHARS: usize = 1000;
/// The polling interval suggested to clients.
const POLL_INTERVAL_MS: u64 = 250;

/// The tasks of one server, and whose they are.
#[derive(Clone)]
pub(crate) struct CellTasks {
    tasks: Arc<Mutex<HashMap<String, Entry>>>,
    /// How long a finished task's result is kept (`--task-ttl`).
    retention: Duration,
}

/// One task: its own manager (dropping it frees the result), whose it is, and its times.
struct Entry {
    manager: TaskManager,
    owner: Caller,
    created: Instant,
    /// When its cell ended.
    ended: Option<Instant>,
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
            let manager = tasks.lock().get(&id).map(|e| e.manager.clone());
            if manager.is_none_or(|m| m.cancel_task(&id).is_err()) {
                run.cancel(); // the task is gone already (expired): stop its cell anyway
            }
            wait_ended(&run).await;
        }
    }
}

impl CellTasks {
    /// No tasks yet; a finished task's result is kept for `retention`.
    pub(crate) fn new(retention: Duration) -> Self {
        Self {
            tasks: Arc::default(),
            retention,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

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
        let manager = TaskManager::new();
        let task = manager.spawn(options, move |ctx| {
            Box::pin(async move {
                // rmcp drops this future when the task's TTL passes: the cell stops too.
                let guard = CancelOnDrop(Some(driven.clone()));
                let outcome = drive(&driven, &ctx, can_elicit, &allowances).await;
                let result = driven.take_result();
                drop(guard.disarm());
                // The kernel is free: the session no longer holds the ended run.
                {
                    let mut running = running.lock().unwrap_or_else(|p| p.into_inner());
                    if running.as_ref().is_some_and(|(id, _)| *id == ctx.task_id()) {
                        *running = None;
                    }
                }
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
        if !run.snapshot(usize::MAX).ended {
            *busy.running.lock().unwrap_or_else(|p| p.into_inner()) =
                Some((task.task_id.clone(), run.clone()));
        }
        self.lock().insert(
            task.task_id.clone(),
            Entry {
                manager,
                owner: owner.clone(),
                created: Instant::now(),
                ended: None,
            },
        );
        // Once the cell has ended, its result is kept for `retention`, then forgotten.
        let (tasks, id, retention) = (
            Arc::downgrade(&self.tasks),
            task.task_id.clone(),
            self.retention,
        );
        tokio::spawn(async move {
            wait_ended(&run).await;
            drop(run);
            match tasks.upgrade() {
                Some(tasks) => {
                    if let Some(entry) =
                        tasks.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&id)
                    {
                        entry.ended = Some(Instant::now());
                    }
                }
                None => return,
            }
            tokio::time::sleep(retention).await;
            if let Some(tasks) = tasks.upgrade() {
                tasks.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
            }
        });
        task
    }

    /// `tasks/get` for `caller`: the task's state, its time to live as it became once its cell
    /// ended (its result is kept `--task-ttl` from then). Another credential's task is unknown.
    pub(crate) fn get(
        &self,
        caller: &Caller,
        task_id: &str,
    ) -> Result<DetailedTask, rmcp::ErrorData> {
        let (manager, lived) = {
            let tasks = self.lock();
            let entry = owned(&tasks, caller, task_id)?;
            let lived = entry
                .ended
                .map(|ended| ended.duration_since(entry.created) + self.retention);
            (entry.manager.clone(), lived)
        };
        let mut task = manager.get_task(task_id)?;
        if let Some(lived) = lived {
            task.task.ttl_ms = Some(u64::try_from(lived.as_millis()).unwrap_or(u64::MAX));
        }
        Ok(task)
    }

    /// The task manager of `task_id`, for a request of `caller`: another credential's task
    /// is answered as unknown, as a task that never existed.
    pub(crate) fn manager_for(
        &self,
        caller: &Caller,
        task_id: &str,
    ) -> Result<TaskManager, rmcp::ErrorData> {
        Ok(owned(&self.lock(), caller, task_id)?.manager.clone())
    }
}

/// The entry of `task_id` if `caller` owns it; else the manager's own answer for a task it
/// does not have.
fn owned<'a>(
    tasks: &'a HashMap<String, Entry>,
    caller: &Caller,
    task_id: &str,
) -> Result<&'a Entry, rmcp::ErrorData> {
    match tasks.get(task_id) {
        Some(entry) if entry.owner == *caller => Ok(entry),
        _ => Err(rmcp::ErrorData::invalid_params(
            format!("unknown task: {task_id}"),
            None,
        )),
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
