//! What only MCP 2026-07-28 and its extensions have, driven by rmcp's client: `--approve ask`
//! through `input_required` rounds (one execution resumed, never run twice; several rounds;
//! concurrent calls in one round; forged, replayed and stale `requestState`; no retry), long
//! cells as tasks (the tasks extension, in both eras) and the codeact skill over the skills
//! extension.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::mcp_approvals::{CALL_ADD, Client, cell, register_fixture, start, text};
use crate::mcp_eras::{Answer, Era, ScriptedClient, both_eras};
use crate::support::*;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, GetTaskParams,
    InputRequiredResult, InputResponses, TaskPayload, TaskStatus, UpdateTaskParams,
};
use serde_json::{Value, json};

fn exec_params(code: &str) -> CallToolRequestParams {
    CallToolRequestParams::new("execute_ipython_cell")
        .with_arguments(args(json!({"code": code, "timeout": 60})))
}

/// One `tools/call` without rmcp driving the rounds.
async fn once(c: &Client, params: CallToolRequestParams) -> CallToolResponse {
    c.service
        .call_tool_once(params)
        .await
        .expect("tools/call answers")
}

/// One `tools/call` that must be refused with a JSON-RPC error (invalid params): its message.
async fn refused(c: &Client, params: CallToolRequestParams) -> String {
    match c.service.call_tool_once(params).await {
        Err(rmcp::ServiceError::McpError(e)) => {
            assert_eq!(e.code, rmcp::model::ErrorCode::INVALID_PARAMS, "{e:?}");
            e.message.to_string()
        }
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
}

/// What a retry with a state that is not genuine (or another credential's) is told.
const NOT_VALID: &str = "this requestState is not valid for this call: it was altered, belongs to other arguments, to another credential or to another ipybox process. Nothing ran.";

fn input_required(response: CallToolResponse) -> InputRequiredResult {
    match response {
        CallToolResponse::InputRequired(r) => r,
        other => panic!("expected input_required, got {other:?}"),
    }
}

fn complete(response: CallToolResponse) -> CallToolResult {
    match response {
        CallToolResponse::Complete(r) => r,
        other => panic!("expected a result, got {other:?}"),
    }
}

/// The retry of `params` that answers every request of `round` with `action`.
fn retry(
    params: &CallToolRequestParams,
    round: &InputRequiredResult,
    action: Value,
) -> CallToolRequestParams {
    let mut responses = InputResponses::new();
    for key in round.input_requests.as_ref().unwrap().keys() {
        responses.insert(key.clone(), action.clone());
    }
    params
        .clone()
        .with_input_responses(responses)
        .with_request_state(round.request_state.clone().unwrap())
}

fn accept() -> Value {
    json!({"action": "accept", "content": {}})
}

async fn stateless_asking(
    ws: &Path,
    answers: &[Answer],
    flags: &[&str],
) -> (Client, ScriptedClient) {
    let user = ScriptedClient::new(Era::Stateless, true, answers);
    let mut all = vec!["--approve", "ask"];
    all.extend_from_slice(flags);
    let c = start(ws, &user, &all).await;
    register_fixture(&c).await;
    (c, user)
}

/// An accepted call: the same execution resumes (a counter proves the cell ran once), and the
/// output printed before the pause is in the final result.
#[tokio::test(flavor = "multi_thread")]
async fn an_accepted_round_resumes_the_same_execution() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let (c, user) = stateless_asking(ws.path(), &[Answer::Accept, Answer::Accept], &[]).await;
    let code = format!(
        "runs = globals().get('runs', 0) + 1\nprint('before', flush=True)\n{CALL_ADD}\nprint('runs', runs)"
    );
    assert_eq!(cell(&c, &code).await, (false, "before\n3\nruns 1".into()));
    assert_eq!(cell(&c, &code).await, (false, "before\n3\nruns 2".into()));
    assert_eq!(user.questions().len(), 2);
    c.close().await;
}

/// Two calls one after the other: two rounds, each with a key of its own; a replayed first
/// round, a forged state, a state for other arguments and a state of a round answered already
/// are refused with a JSON-RPC error (what the conformance runner's
/// `sep-2322-reject-tampered-state` expects), and nothing runs.
#[tokio::test(flavor = "multi_thread")]
async fn rounds_replays_forgeries_and_stale_states() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let (c, _user) = stateless_asking(ws.path(), &[], &[]).await;
    let code = format!(
        "runs = globals().get('runs', 0) + 1\n{CALL_ADD}\nfrom mcptools.fx import greet\nprint(greet.run(greet.Params(name='two')))"
    );
    let params = exec_params(&code);
    let first = input_required(once(&c, params.clone()).await);
    let keys: Vec<&String> = first.input_requests.as_ref().unwrap().keys().collect();
    assert_eq!(keys, ["approval-0-0"]);
    let second = input_required(once(&c, retry(&params, &first, accept())).await);
    let keys: Vec<&String> = second.input_requests.as_ref().unwrap().keys().collect();
    assert_eq!(keys, ["approval-1-0"]);
    // A replay of the first round: stale, refused.
    assert_eq!(
        refused(&c, retry(&params, &first, accept())).await,
        "this requestState is stale: round 0 of this cell was answered already (it waits in round 1). Nothing ran.\n  help: retry with the requestState of the newest input_required result"
    );
    // Forged, tampered, and bound to other arguments.
    let mut forged = retry(&params, &second, accept());
    forged.request_state = Some("eyJpZCI6MSwicm91bmQiOjF9.AAAA".into());
    assert!(refused(&c, forged).await.starts_with(NOT_VALID));
    let mut tampered = retry(&params, &second, accept());
    tampered.request_state = Some(format!(
        "{}-TAMPERED",
        second.request_state.clone().unwrap()
    ));
    assert!(refused(&c, tampered).await.starts_with(NOT_VALID));
    let other = retry(&exec_params("print('other code')"), &second, accept());
    assert!(refused(&c, other).await.starts_with(NOT_VALID));
    // An answer of the wrong shape (what the runner's validate-input sends): refused, the
    // round still waits.
    assert_eq!(
        refused(&c, retry(&params, &second, json!(12345))).await,
        "inputResponses[\"approval-1-0\"] is not an elicitation result (invalid type: integer `12345`, expected struct ElicitResult). Nothing ran; the cell still waits for this answer.\n  help: answer each key of inputRequests with {\"action\": \"accept\" | \"decline\" | \"cancel\", \"content\": {...}}"
    );
    // The real second round still works.
    let done = complete(once(&c, retry(&params, &second, accept())).await);
    assert_eq!(text(&done), "3\nHello, two!");
    // And its state cannot be used again.
    assert_eq!(
        refused(&c, retry(&params, &second, accept())).await,
        "this requestState is stale: round 1 of this cell was answered already. Nothing ran.\n  help: retry with the requestState of the newest input_required result; a result already received stands"
    );
    // Nothing ran twice.
    assert_eq!(cell(&c, "print(runs)").await, (false, "1".into()));
    c.close().await;
}

/// An answer that comes after the approval timeout: the call failed in the kernel, the cell ran
/// on to its end (once), and the late retry is told so, with the cell's result, in words for the
/// model (not "run the cell again"); nothing runs now.
#[tokio::test(flavor = "multi_thread")]
async fn a_late_answer_is_told_what_happened() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let (c, _user) = stateless_asking(ws.path(), &[], &["--approval-timeout", "1"]).await;
    let code = format!(
        "runs = globals().get('runs', 0) + 1\nprint('before', flush=True)\ntry:\n    {}\nexcept Exception as e:\n    print(type(e).__name__)\nprint('after')",
        CALL_ADD.replace('\n', "\n    ")
    );
    let params = exec_params(&code);
    let round = input_required(once(&c, params.clone()).await);
    // The call times out (1 s) and the cell ends; the next cell waits for that.
    assert_eq!(cell(&c, "print(runs)").await, (false, "1".into()));
    let late = complete(once(&c, retry(&params, &round, accept())).await);
    assert_ne!(late.is_error, Some(true), "the cell itself succeeded");
    let said = text(&late);
    let prefix = "[ipybox: this answer came too late. The cell had stopped waiting for it, so the call it asked about was not made: fx.add(a=1, b=2). The cell went on to its end ";
    assert!(said.starts_with(prefix), "{said}");
    assert!(
        said.ends_with(" s ago; it ran once, and nothing ran now. Its result:]\n\nbefore\nApprovalTimeoutError\nafter"),
        "{said}"
    );
    // Nothing ran again.
    assert_eq!(cell(&c, "print(runs)").await, (false, "1".into()));
    // The same late state again: the same answer (it is a record, not a run).
    let again = complete(once(&c, retry(&params, &round, accept())).await);
    assert!(text(&again).starts_with(prefix), "{}", text(&again));
    c.close().await;
}

/// Eight calls in flight at once (`asyncio.gather`) are asked about in one round.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_calls_share_one_round() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let (c, _user) = stateless_asking(ws.path(), &[], &[]).await;
    let code = "import asyncio\nfrom mcptools.fx import runner\nsums = await asyncio.gather(*(runner.run_async('add', {'a': i, 'b': 1}) for i in range(8)))\nprint([s['sum'] for s in sums])";
    let params = exec_params(code);
    let round = input_required(once(&c, params.clone()).await);
    assert_eq!(round.input_requests.as_ref().unwrap().len(), 8, "{round:?}");
    let done = complete(once(&c, retry(&params, &round, accept())).await);
    assert_eq!(text(&done), "[1, 2, 3, 4, 5, 6, 7, 8]");
    c.close().await;
}

/// No retry within the approval timeout: the waiting call fails in the kernel with
/// ApprovalTimeoutError, the cell runs on to its end, and the next cell is not held up.
#[tokio::test(flavor = "multi_thread")]
async fn no_retry_times_the_call_out_in_the_kernel() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let (c, _user) = stateless_asking(ws.path(), &[], &["--approval-timeout", "1"]).await;
    let code = format!(
        "try:\n    {}\nexcept Exception as e:\n    err = repr(e)",
        CALL_ADD.replace('\n', "\n    ")
    );
    let round = input_required(once(&c, exec_params(&code)).await);
    assert_eq!(round.input_requests.as_ref().unwrap().len(), 1);
    // Never answered. The next cell runs once the call has timed out (1 s).
    let start = Instant::now();
    let (failed, out) = cell(&c, "print(err)").await;
    assert!(!failed, "{out}");
    assert!(
        out.starts_with("ApprovalTimeoutError('Approval request for fx.add expired"),
        "{out}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    c.close().await;
}

/// Tasks (both eras): a cell that outlives `--task-after` becomes a task; `tasks/get` shows the
/// output so far and finally the same result a plain call returns.
async fn a_long_cell_becomes_a_task(era: Era) {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let user = ScriptedClient::new(era, true, &[]).with_tasks();
    let c = start(ws.path(), &user, &["--task-after", "0.5"]).await;
    // Short cells stay plain results.
    assert_eq!(cell(&c, "x = 20\nprint(x + 1)").await, (false, "21".into()));
    let code = "import time\nprint('started', flush=True)\ntime.sleep(2)\nprint('done', x * 2)";
    let created = Instant::now();
    let task = match once(&c, exec_params(code)).await {
        CallToolResponse::Task(t) => t.task,
        other => panic!("expected a task, got {other:?}"),
    };
    assert!(created.elapsed() < Duration::from_millis(1500));
    assert_eq!(task.status, TaskStatus::Working);
    assert_eq!(task.status_message.as_deref(), Some("started\n"));
    // While it runs, the kernel is busy: a second cell is refused with the task's name.
    let (failed, out) = cell(&c, "1").await;
    assert!(failed);
    assert!(
        out.starts_with(&format!(
            "the kernel is busy: task {} has been running a cell for",
            task.task_id
        )),
        "{out}"
    );
    let result = poll_until_terminal(&c, &task.task_id).await;
    match result {
        TaskPayload::Completed { result } => {
            let result: CallToolResult = serde_json::from_value(Value::Object(result)).unwrap();
            assert_eq!(text(&result), "started\ndone 40");
        }
        other => panic!("{other:?}"),
    }
    // The result stays available; the kernel is free again.
    poll_until_terminal(&c, &task.task_id).await;
    assert_eq!(cell(&c, "x").await, (false, "20".into()));
    c.close().await;
}

async fn poll_until_terminal(c: &Client, task_id: &str) -> TaskPayload {
    let start = Instant::now();
    loop {
        let got = c
            .peer()
            .get_task(GetTaskParams::new(task_id.to_string()))
            .await
            .expect("tasks/get answers");
        if got.task.status().is_terminal() {
            return got.task.payload;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "task never ended"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An approval inside a task: the task reports `input_required` with the question, the
/// answer goes in with `tasks/update`, the call runs; `tasks/cancel` interrupts a cell and keeps
/// the kernel's state.
async fn approvals_and_cancel_inside_tasks(era: Era) {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let user = ScriptedClient::new(era, true, &[]).with_tasks();
    let c = start(ws.path(), &user, &["--approve", "ask", "--task-after", "0"]).await;
    register_fixture(&c).await;
    let task = match once(&c, exec_params(&format!("kept = 1\n{CALL_ADD}"))).await {
        CallToolResponse::Task(t) => t.task,
        other => panic!("expected a task, got {other:?}"),
    };
    let start = Instant::now();
    let requests = loop {
        let got = c
            .peer()
            .get_task(GetTaskParams::new(task.task_id.clone()))
            .await
            .unwrap();
        if let TaskPayload::InputRequired { input_requests } = got.task.payload {
            break input_requests;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "never asked");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let question = serde_json::to_value(requests.values().next().unwrap()).unwrap();
    assert_eq!(
        question["params"]["message"],
        crate::mcp_approvals::ask_add()
    );
    let mut answers = InputResponses::new();
    answers.insert(requests.keys().next().unwrap().clone(), accept());
    c.peer()
        .update_task(UpdateTaskParams::new(task.task_id.clone(), answers))
        .await
        .unwrap();
    match poll_until_terminal(&c, &task.task_id).await {
        TaskPayload::Completed { result } => {
            let result: CallToolResult = serde_json::from_value(Value::Object(result)).unwrap();
            assert_eq!(text(&result), "3");
        }
        other => panic!("{other:?}"),
    }
    // Cancel: the cell is interrupted, state kept.
    let task = match once(
        &c,
        exec_params("import time\nkept = 2\ntime.sleep(60)\nkept = 3"),
    )
    .await
    {
        CallToolResponse::Task(t) => t.task,
        other => panic!("expected a task, got {other:?}"),
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.peer()
        .cancel_task(CancelTaskParams::new(task.task_id.clone()))
        .await
        .unwrap();
    let cancelled = Instant::now();
    assert_eq!(
        poll_until_terminal(&c, &task.task_id).await,
        TaskPayload::Cancelled
    );
    assert!(cancelled.elapsed() < Duration::from_secs(5));
    // With --task-after 0 every cell is a task; this one finishes at once.
    let task = match once(&c, exec_params("print(kept)")).await {
        CallToolResponse::Task(t) => t.task,
        other => panic!("expected a task, got {other:?}"),
    };
    match poll_until_terminal(&c, &task.task_id).await {
        TaskPayload::Completed { result } => {
            let result: CallToolResult = serde_json::from_value(Value::Object(result)).unwrap();
            assert_eq!(text(&result), "2");
        }
        other => panic!("{other:?}"),
    }
    c.close().await;
}

/// A task's result is kept for `--task-ttl` after the cell's timeout window, then forgotten; a
/// client without the extension always gets plain results; `reset` cancels a running task.
#[tokio::test(flavor = "multi_thread")]
async fn task_expiry_plain_clients_and_reset() {
    require!(TestEnv);
    let ws = tempfile::tempdir().unwrap();
    let user = ScriptedClient::new(Era::Stateless, false, &[]).with_tasks();
    let c = start(ws.path(), &user, &["--task-after", "0", "--task-ttl", "1"]).await;
    let params = CallToolRequestParams::new("execute_ipython_cell")
        .with_arguments(args(json!({"code": "print('quick')", "timeout": 1})));
    let task = match once(&c, params).await {
        CallToolResponse::Task(t) => t.task,
        other => panic!("expected a task, got {other:?}"),
    };
    assert_eq!(task.ttl_ms, Some(2000));
    assert!(matches!(
        poll_until_terminal(&c, &task.task_id).await,
        TaskPayload::Completed { .. }
    ));
    tokio::time::sleep(Duration::from_millis(4200)).await;
    let gone = c
        .peer()
        .get_task(GetTaskParams::new(task.task_id.clone()))
        .await
        .unwrap_err();
    assert!(gone.to_string().contains("unknown task"), "{gone}");
    // reset cancels a running task's cell.
    let task = match once(&c, exec_params("import time\ntime.sleep(60)")).await {
        CallToolResponse::Task(t) => t.task,
        other => panic!("expected a task, got {other:?}"),
    };
    let reset = Instant::now();
    let out = call(&c, "reset", json!({})).await;
    assert_ne!(out.is_error, Some(true), "{}", text(&out));
    assert!(reset.elapsed() < Duration::from_secs(5));
    assert_eq!(
        poll_until_terminal(&c, &task.task_id).await,
        TaskPayload::Cancelled
    );
    c.close().await;
    // Without the extension: plain results, however long the cell.
    let plain = ScriptedClient::new(Era::Stateless, false, &[]);
    let c = start(ws.path(), &plain, &["--task-after", "0"]).await;
    assert_eq!(
        cell(&c, "import time\ntime.sleep(1)\nprint('plain')").await,
        (false, "plain".into())
    );
    c.close().await;
}

/// The codeact skill over MCP: listed, described and read byte for byte from `skills/codeact`.
async fn the_codeact_skill_is_served(era: Era) {
    let ws = tempfile::tempdir().unwrap();
    let user = ScriptedClient::new(era, false, &[]);
    let c = start(ws.path(), &user, &[]).await;
    let skills = c.peer().list_all_skills().await.unwrap();
    let uris: Vec<&str> = skills.iter().map(|s| s.uri.as_str()).collect();
    assert_eq!(uris, ["skill://codeact/SKILL.md"]);
    let got = c
        .peer()
        .get_skill(rmcp::model::GetSkillRequestParams::new(
            "skill://codeact/SKILL.md",
        ))
        .await
        .unwrap();
    assert_eq!(got.skill.name(), "codeact");
    let dir = root().join("skills/codeact");
    for file in [
        "SKILL.md",
        "references/output-parsers.md",
        "references/saving-code-actions.md",
    ] {
        let read = c
            .peer()
            .read_resource(rmcp::model::ReadResourceRequestParams::new(format!(
                "skill://codeact/{file}"
            )))
            .await
            .unwrap();
        let served = match &read.contents[0] {
            rmcp::model::ResourceContents::TextResourceContents { text, .. } => text.clone(),
            other => panic!("{file}: {other:?}"),
        };
        assert_eq!(
            served,
            std::fs::read_to_string(dir.join(file)).unwrap(),
            "{file}"
        );
    }
    c.close().await;
}

both_eras!(a_long_cell_becomes_a_task);
both_eras!(approvals_and_cancel_inside_tasks);
both_eras!(the_codeact_skill_is_served);
