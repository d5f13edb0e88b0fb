//! Approval of tool calls: every call from kernel code is a request the application accepts or
//! rejects before it reaches the MCP server.
//!
//! The executor sets an [`ApprovalPolicy`] per execution: `execute()` accepts all, `stream()`
//! hands each [`ApprovalRequest`] to its caller. Between executions the last policy stays; a
//! streamed execution's channel is closed when it ends, so a call made by a leftover background
//! thread is rejected rather than slipping through unapproved. Waiting is bounded by the approval
//! timeout, and the execution's timeout clock is paused meanwhile.
//!
//! Shell commands (`!cmd`, `%%bash`, ... with `approve_shell_cmds`) are requests too: server name
//! [`SHELL_SERVER_NAME`], tool name [`SHELL_TOOL`] or [`SHELL_MAGIC_TOOL`], arguments
//! `{"cmd": ...}`; [`ApprovalRequest::is_shell_command`] tells them apart from a tool call of an MCP
//! server that happens to be registered as `ipybox`.
//!
//! Before anyone is asked, a request must be showable whole (see [`super::shown`]: nothing in a
//! prompt is ever cut): names longer than [`shown::MAX_NAME_CHARS`], or a rendering longer than
//! the executor's text limit (set for people: the MCP server and `ipybox exec`), are refused
//! with `ApprovalRejectedError`. At most [`MAX_OUTSTANDING_PROMPTS`] requests of one execution are in
//! front of the decider at once; later calls wait in a queue (their wait counts against the
//! approval timeout), and identical calls waiting in the queue are merged into one request that
//! says how many calls it decides ([`ApprovalRequest::calls`]). Identical means identical as sent:
//! the same kind, server (and its registration), tool, and the same bytes of JSON arguments
//! (`0.0` and `-0.0`, `1` and `1.0`, `{"a":1,"b":2}` and `{"b":2,"a":1}` are different calls,
//! asked about apart: what the user is shown is exactly what runs, for every call decided).
//!
//! Not here: the transport that carries calls from the kernel ([`super::server`]).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::shown::{self, Syntax};
use crate::pause::TimeoutPause;

/// Default time a tool call waits for an approval decision.
pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(60);

/// The most approval requests of one execution in front of the decider at once; later calls
/// wait in a queue until one is decided. Enough for `asyncio.gather` of 8 calls to be asked
/// about at once; a flood of 1 000 threads puts 8 prompts in front of the user, not 1 000.
pub const MAX_OUTSTANDING_PROMPTS: usize = 8;

/// The server name of shell-command approval requests.
pub const SHELL_SERVER_NAME: &str = "ipybox";
/// The tool name of a line command's request: `!cmd`, `!!cmd`, `x = !cmd`, `%sx`, `%system` and
/// shell aliases.
pub const SHELL_TOOL: &str = "shell";
/// The tool name of a cell magic's request: `%%bash`, `%%sh`, `%%script`, and the other script
/// magics (`%%perl`, `%%ruby`, ...).
pub const SHELL_MAGIC_TOOL: &str = "shell_magic";

/// What kind of action a request is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RequestKind {
    ToolCall,
    ShellCommand,
}

/// A tool call (or a shell command) waiting for a decision. Dropping it without deciding rejects
/// the call.
#[derive(Debug)]
pub struct ApprovalRequest {
    /// The server name the tool was registered under ([`SHELL_SERVER_NAME`] for shell
    /// commands).
    pub server_name: String,
    /// The tool's name as the MCP server knows it ([`SHELL_TOOL`] or [`SHELL_MAGIC_TOOL`] for
    /// shell commands).
    pub tool_name: String,
    /// The arguments exactly as they will be sent. Shell commands: `{"cmd": ...}`, the command
    /// after variable expansion (what runs); cell magics also `"magic"`, the full magic line as
    /// it runs, after expansion (`%%script /bin/sh`, `%%bash --out x`), see
    /// [`ApprovalRequest::shell_magic`].
    pub arguments: Map<String, Value>,
    /// For tool calls: the registered server's command line or URL, as recorded at registration
    /// (`${VAR}` placeholders unresolved) — what the call reaches. `None` for shell commands.
    pub server_command: Option<String>,
    /// For tool calls: a fingerprint of the registered server's recorded params (for keying
    /// "allow for the session" by the server that really runs).
    server_identity: Option<String>,
    kind: RequestKind,
    /// The waiting calls this decision answers (more than one when identical queued calls were
    /// merged).
    reply: Vec<oneshot::Sender<Verdict>>,
    /// Frees this request's place among the outstanding prompts when it is decided or dropped.
    slot: Option<Slot>,
    /// What the decider showed, if it said ([`ApprovalRequest::shown_as`]).
    question: Option<String>,
}

/// The answer sent back to the waiting call.
#[derive(Debug, Clone)]
struct Verdict {
    /// [`Answer::Accepted`], [`Answer::Remembered`], [`Answer::AutoAccepted`] (the call goes
    /// ahead) or [`Answer::Declined`].
    answer: Answer,
    /// Why it was declined, carried by the kernel's error (if any).
    reason: Option<String>,
    /// What the decider showed (recorded with the answer).
    question: Option<String>,
}

impl ApprovalRequest {
    /// Lets the call go ahead (every call of [`ApprovalRequest::calls`]).
    pub fn accept(self) {
        self.send(Answer::Accepted, None);
    }

    /// [`ApprovalRequest::accept`] without asking anyone, because an earlier answer ("allow for
    /// the rest of the session") covers this call. The session notebook records it as
    /// remembered.
    pub fn accept_remembered(self) {
        self.send(Answer::Remembered, None);
    }

    /// [`ApprovalRequest::accept`] without asking anyone, because the application accepts
    /// everything (`ipybox exec --yes`). The session notebook records it as auto-accepted.
    pub fn accept_unasked(self) {
        self.send(Answer::AutoAccepted, None);
    }

    /// Fails the call in the kernel with `ApprovalRejectedError`.
    pub fn reject(self) {
        self.send(Answer::Declined, None);
    }

    /// [`ApprovalRequest::reject`], with a reason appended to the kernel's error message (e.g.
    /// why nobody could be asked).
    pub fn reject_with(self, reason: impl Into<String>) {
        self.send(Answer::Declined, Some(reason.into()));
    }

    /// Says what the person deciding was shown (an MCP client's question, a terminal prompt),
    /// for the session notebook, which records it with the answer. Default:
    /// [`ApprovalRequest::describe`]. Changes nothing about the call.
    pub fn shown_as(&mut self, question: impl Into<String>) {
        self.question = Some(question.into());
    }

    fn send(mut self, answer: Answer, reason: Option<String>) {
        let question = self.question.take().or_else(|| match answer {
            Answer::AutoAccepted | Answer::Remembered => None,
            _ => Some(self.describe()),
        });
        let verdict = Verdict {
            answer,
            reason,
            question,
        };
        for reply in std::mem::take(&mut self.reply) {
            let _ = reply.send(verdict.clone());
        }
    }

    /// How many identical calls this decision answers: 1, or more when calls with the same
    /// server, tool and arguments waited in the queue together (they are asked about once;
    /// [`ApprovalRequest::describe`] says how many).
    pub fn calls(&self) -> usize {
        self.reply.len().max(1)
    }

    /// For tool calls, a fingerprint of the registered server's recorded params: two requests
    /// with the same server name but a re-registered server differ here.
    pub fn server_identity(&self) -> Option<&str> {
        self.server_identity.as_deref()
    }

    /// Whether this is a shell command (`approve_shell_cmds`) rather than an MCP tool call.
    pub fn is_shell_command(&self) -> bool {
        self.kind == RequestKind::ShellCommand
    }

    /// The command of a shell-command request (for a cell magic, its cell).
    pub fn shell_command(&self) -> Option<&str> {
        match self.kind {
            RequestKind::ShellCommand => self.arguments.get("cmd").and_then(Value::as_str),
            RequestKind::ToolCall => None,
        }
    }

    /// The magic line of a cell-magic request, as it runs (after variable expansion):
    /// `%%bash`, `%%script /bin/sh`. `None` for line commands and tool calls. A remembered
    /// decision about a cell magic must key on this and the cell together.
    pub fn shell_magic(&self) -> Option<&str> {
        match self.kind {
            RequestKind::ShellCommand => self.arguments.get("magic").and_then(Value::as_str),
            RequestKind::ToolCall => None,
        }
    }

    /// What this request is about, for prompts and logs: `server.tool(a=1, name="x")`,
    /// ``shell command `cmd` ``, or `%%bash cell:` and the cell line by line. Rendered by
    /// [`shown`]: names and strings quoted and escaped, nothing cut.
    pub fn describe(&self) -> String {
        self.describe_as(Syntax::Json)
    }

    /// [`ApprovalRequest::describe`] with values in `syntax` (the Python wheel writes Python
    /// literals, as Python ipybox 0.9.2's `str(request)` did).
    pub fn describe_as(&self, syntax: Syntax) -> String {
        let text = render(
            &self.server_name,
            &self.tool_name,
            &self.arguments,
            self.kind,
            syntax,
        );
        match self.calls() {
            1 => text,
            n => format!("{text} [{n} identical calls]"),
        }
    }
}

/// The rendering of a request (see [`ApprovalRequest::describe`]).
fn render(
    server: &str,
    tool: &str,
    arguments: &Map<String, Value>,
    kind: RequestKind,
    syntax: Syntax,
) -> String {
    let cmd = arguments.get("cmd").and_then(Value::as_str);
    match (kind, cmd) {
        (RequestKind::ShellCommand, Some(cmd)) => {
            let body = shown::command(cmd);
            let magic = arguments.get("magic").and_then(Value::as_str);
            let what = match magic {
                Some(magic) => format!("{} cell", magic_line(magic)),
                None => "shell command".to_string(),
            };
            if body.contains('\n') {
                format!("{what}:\n{body}")
            } else {
                format!("{what} `{body}`")
            }
        }
        _ => shown::call(server, tool, arguments, syntax),
    }
}

/// A magic line as shown: as it runs, or quoted if it spans lines (a direct call can pass any
/// text).
pub fn magic_line(magic: &str) -> String {
    if magic.contains(['\n', '\r']) {
        shown::string(magic, Syntax::Json)
    } else {
        shown::command(magic)
    }
}

/// The first `max` characters of `text`, with `…` when cut: error messages and logs only, never
/// what a prompt shows (nothing is cut from a prompt, see [`shown`]).
pub fn shorten(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_string(),
        Some((cut, _)) => format!("{}…", &text[..cut]),
    }
}

/// Who decides about tool calls.
#[derive(Debug, Clone)]
pub(crate) enum ApprovalPolicy {
    /// Every call is approved (the `execute()` and MCP-server behaviour).
    AcceptAll,
    /// Each call is sent to the asker's channel (at most [`MAX_OUTSTANDING_PROMPTS`] at once)
    /// and waits for `accept()` / `reject()`, or until its token is cancelled (the execution
    /// that asks was cancelled): then it is rejected, also while the application still holds
    /// the request.
    Ask(Arc<Asker>),
}

impl ApprovalPolicy {
    /// Asks through `tx`; waits end (rejected) when `cancelled` is cancelled.
    pub(crate) fn ask(
        tx: mpsc::UnboundedSender<ApprovalRequest>,
        cancelled: CancellationToken,
    ) -> Self {
        Self::Ask(Arc::new(Asker {
            tx,
            cancelled,
            queue: Mutex::new(Queue::default()),
        }))
    }
}

/// One execution's decider: its channel, its cancellation, and its queue of prompts.
pub(crate) struct Asker {
    tx: mpsc::UnboundedSender<ApprovalRequest>,
    cancelled: CancellationToken,
    queue: Mutex<Queue>,
}

impl std::fmt::Debug for Asker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        f.debug_struct("Asker")
            .field("outstanding", &queue.outstanding)
            .field("queued", &queue.waiting.len())
            .finish()
    }
}

#[derive(Default)]
struct Queue {
    /// Requests handed to the decider and not yet decided or dropped.
    outstanding: usize,
    waiting: VecDeque<Queued>,
}

/// Calls waiting for a place among the outstanding prompts (identical calls share one entry).
struct Queued {
    server_name: String,
    tool_name: String,
    arguments: Map<String, Value>,
    /// The arguments as they go out on the wire (serialized in their order, numbers as
    /// written): what "identical" compares.
    wire: Vec<u8>,
    server_command: Option<String>,
    server_identity: Option<String>,
    kind: RequestKind,
    waiters: Vec<oneshot::Sender<Verdict>>,
}

impl Queued {
    fn new(subject: &Subject<'_>, reply: oneshot::Sender<Verdict>) -> Self {
        Self {
            server_name: subject.server_name.to_string(),
            tool_name: subject.tool_name.to_string(),
            arguments: subject.arguments.clone(),
            wire: wire_bytes(subject.arguments),
            server_command: subject.server.map(|s| s.target.clone()),
            server_identity: subject.server.map(|s| s.identity.clone()),
            kind: subject.kind,
            waiters: vec![reply],
        }
    }
}

/// `arguments` serialized as they are sent to the MCP server (the tool server forwards this
/// map; serde_json keeps its order and writes each number as parsed).
fn wire_bytes(arguments: &Map<String, Value>) -> Vec<u8> {
    serde_json::to_vec(arguments).unwrap_or_default()
}

/// A place among an execution's outstanding prompts; given back when dropped (unless disarmed:
/// `None`).
struct Slot(Option<Arc<Asker>>);

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Slot")
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(asker) = self.0.take() {
            asker.release();
        }
    }
}

impl Asker {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Shows `subject` now if fewer than [`MAX_OUTSTANDING_PROMPTS`] are outstanding, else
    /// queues it (with an identical queued call if there is one).
    fn submit(self: &Arc<Self>, subject: &Subject<'_>) -> oneshot::Receiver<Verdict> {
        let (reply, decision) = oneshot::channel();
        let mut queue = self.lock();
        if queue.outstanding < MAX_OUTSTANDING_PROMPTS {
            queue.outstanding += 1;
            drop(queue);
            let queued = Queued::new(subject, reply);
            if let Err(refused) = self.tx.send(self.request(queued)) {
                // Nobody listens (the streamed execution that asked has ended): dropping the
                // request rejects it and gives its place to the next, which fails the same way.
                drop(refused.0);
            }
            return decision;
        }
        // Merged only when identical as sent: `Map`'s own equality holds `0.0 == -0.0` and
        // ignores key order, which the wire keeps.
        let wire = wire_bytes(subject.arguments);
        let same = queue.waiting.iter_mut().find(|q| {
            q.kind == subject.kind
                && q.server_name == subject.server_name
                && q.server_identity.as_deref() == subject.server.map(|s| s.identity.as_str())
                && q.tool_name == subject.tool_name
                && q.wire == wire
        });
        match same {
            Some(same) => same.waiters.push(reply),
            None => queue.waiting.push_back(Queued::new(subject, reply)),
        }
        decision
    }

    fn request(self: &Arc<Self>, queued: Queued) -> ApprovalRequest {
        ApprovalRequest {
            server_name: queued.server_name,
            tool_name: queued.tool_name,
            arguments: queued.arguments,
            server_command: queued.server_command,
            server_identity: queued.server_identity,
            kind: queued.kind,
            reply: queued.waiters,
            slot: Some(Slot(Some(self.clone()))),
            question: None,
        }
    }

    /// A decided (or dropped) request's place goes to the next queued call that still waits.
    fn release(self: &Arc<Self>) {
        loop {
            let next = {
                let mut queue = self.lock();
                loop {
                    match queue.waiting.pop_front() {
                        None => {
                            queue.outstanding = queue.outstanding.saturating_sub(1);
                            return;
                        }
                        Some(mut queued) => {
                            queued.waiters.retain(|w| !w.is_closed());
                            if !queued.waiters.is_empty() {
                                break queued;
                            }
                        }
                    }
                }
            };
            match self.tx.send(self.request(next)) {
                Ok(()) => return,
                Err(refused) => {
                    // Nobody listens: reject this one without recursing, then try the next.
                    let mut request = refused.0;
                    if let Some(slot) = request.slot.as_mut() {
                        slot.0 = None;
                    }
                    drop(request);
                }
            }
        }
    }
}

/// What became of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    Accepted,
    /// Rejected, with the decider's reason if it gave one.
    Rejected(Option<String>),
    TimedOut,
}

/// What a decision is asked about.
pub(crate) struct Subject<'a> {
    pub(crate) server_name: &'a str,
    pub(crate) tool_name: &'a str,
    pub(crate) arguments: &'a Map<String, Value>,
    pub(crate) kind: RequestKind,
    /// The registered server a tool call reaches (`None` for shell commands).
    pub(crate) server: Option<&'a super::registry::Registered>,
}

/// Why `subject` cannot be shown whole (so nobody is asked), if it cannot: a name over
/// [`shown::MAX_NAME_CHARS`], or a rendering over `text_limit` characters.
pub(crate) fn unshowable(subject: &Subject<'_>, text_limit: Option<usize>) -> Option<String> {
    const WHY: &str = "nothing in an approval prompt is ever cut, so a request that cannot be shown whole is refused before anyone is asked";
    let long = |what: &str, name: &str| {
        let n = name.chars().count();
        (n > shown::MAX_NAME_CHARS).then(|| {
            format!(
                "its {what} is {n} characters long, over the limit of {} for names in an approval prompt ({WHY})\n  help: use the names the server declares",
                shown::MAX_NAME_CHARS
            )
        })
    };
    let names = (subject.kind == RequestKind::ToolCall)
        .then(|| {
            long("server name", subject.server_name)
                .or_else(|| long("tool name", subject.tool_name))
                .or_else(|| {
                    subject
                        .arguments
                        .keys()
                        .find_map(|k| long("argument name", k))
                })
        })
        .flatten();
    if names.is_some() {
        return names;
    }
    let limit = text_limit?;
    let text = render(
        subject.server_name,
        subject.tool_name,
        subject.arguments,
        subject.kind,
        Syntax::Json,
    );
    let n = text.chars().count();
    (n > limit).then(|| {
        let help = match subject.kind {
            RequestKind::ToolCall => "pass large data through a file in the workspace, or make several smaller calls",
            RequestKind::ShellCommand => "write a long script to a file in the workspace and run that (`!bash script.sh`)",
        };
        format!(
            "it is {n} characters long when shown, over the limit of {limit} for an approval prompt ({WHY})\n  help: {help}"
        )
    })
}

/// Asks for a decision under `policy`, pausing the execution clock while waiting (in the queue
/// too), and records it in `log`. `text_limit`: the longest rendering a person is shown (see
/// [`unshowable`]).
pub(crate) async fn decide(
    policy: &ApprovalPolicy,
    subject: Subject<'_>,
    timeout: Duration,
    pause: &TimeoutPause,
    text_limit: Option<usize>,
    log: &CallLog,
) -> Decision {
    let started = std::time::Instant::now();
    let (decision, answer, question) =
        decide_unlogged(policy, &subject, timeout, pause, text_limit).await;
    log.push(|| CallRecord {
        shell: subject.kind == RequestKind::ShellCommand,
        server_name: subject.server_name.to_string(),
        tool_name: subject.tool_name.to_string(),
        arguments: subject.arguments.clone(),
        question: question.or_else(|| match answer {
            // Nobody answered: what a decider was shown is not known here, the request's
            // rendering is what every surface shows.
            Answer::TimedOut | Answer::Cancelled | Answer::Unanswered => Some(render(
                subject.server_name,
                subject.tool_name,
                subject.arguments,
                subject.kind,
                Syntax::Json,
            )),
            _ => None,
        }),
        answer,
        reason: match &decision {
            Decision::Rejected(reason) => reason.clone(),
            _ => None,
        },
        waited: started.elapsed(),
    });
    decision
}

async fn decide_unlogged(
    policy: &ApprovalPolicy,
    subject: &Subject<'_>,
    timeout: Duration,
    pause: &TimeoutPause,
    text_limit: Option<usize>,
) -> (Decision, Answer, Option<String>) {
    let asker = match policy {
        ApprovalPolicy::AcceptAll => return (Decision::Accepted, Answer::AutoAccepted, None),
        ApprovalPolicy::Ask(asker) => asker,
    };
    if asker.cancelled.is_cancelled() {
        return (
            Decision::Rejected(Some(CANCELLED.into())),
            Answer::Cancelled,
            None,
        );
    }
    if let Some(reason) = unshowable(subject, text_limit) {
        return (
            Decision::Rejected(Some(format!("not shown to anyone: {reason}"))),
            Answer::Refused,
            None,
        );
    }
    let _paused = pause.pause();
    let decision = asker.submit(subject);
    tokio::select! {
        decided = tokio::time::timeout(timeout, decision) => match decided {
            Ok(Ok(verdict)) => {
                let decision = match verdict.answer {
                    Answer::Accepted | Answer::Remembered | Answer::AutoAccepted => Decision::Accepted,
                    _ => Decision::Rejected(verdict.reason),
                };
                (decision, verdict.answer, verdict.question)
            }
            Ok(Err(_)) => (Decision::Rejected(None), Answer::Unanswered, None),
            Err(_) => (Decision::TimedOut, Answer::TimedOut, None),
        },
        // A late accept() finds the reply channel closed: the call never goes ahead.
        () = asker.cancelled.cancelled() => (Decision::Rejected(Some(CANCELLED.into())), Answer::Cancelled, None),
    }
}

/// What became of a tool call or shell command, as the session notebook records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Asked, and accepted.
    Accepted,
    /// Accepted without asking: an earlier "allow for the rest of the session" covers it.
    Remembered,
    /// Accepted without asking anyone: the policy accepts every call (`execute()`, the MCP
    /// server's `--approve auto`, `ipybox exec --yes`).
    AutoAccepted,
    /// Asked, and declined (rejected by the application).
    Declined,
    /// Asked, and not answered within the approval timeout.
    TimedOut,
    /// Its execution was cancelled while it waited (or before it was asked).
    Cancelled,
    /// Not shown to anyone: it could not be shown whole (see [`unshowable`]).
    Refused,
    /// The request was dropped without an answer (the stream that asked was gone).
    Unanswered,
}

impl Answer {
    /// The word the notebook records: `accepted`, `remembered`, `auto-accepted`, `declined`,
    /// `timed out`, `cancelled`, `refused`, `unanswered`.
    pub fn as_str(self) -> &'static str {
        match self {
            Answer::Accepted => "accepted",
            Answer::Remembered => "remembered",
            Answer::AutoAccepted => "auto-accepted",
            Answer::Declined => "declined",
            Answer::TimedOut => "timed out",
            Answer::Cancelled => "cancelled",
            Answer::Refused => "refused",
            Answer::Unanswered => "unanswered",
        }
    }
}

/// One decision about a tool call or a shell command, for the session notebook.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRecord {
    /// A shell command (server [`SHELL_SERVER_NAME`]) rather than an MCP tool call.
    pub shell: bool,
    pub server_name: String,
    pub tool_name: String,
    /// The arguments as the kernel sent them (what goes to the server; never the server's
    /// `${VAR}`-resolved params, which are not arguments).
    pub arguments: Map<String, Value>,
    /// What the decider was shown (`None`: nobody was asked).
    pub question: Option<String>,
    pub answer: Answer,
    /// Why it was declined or not asked, if said.
    pub reason: Option<String>,
    /// How long the call waited for its answer.
    pub waited: Duration,
}

/// Where the decisions of one execution are recorded (the session notebook's source); the
/// default records nothing.
#[derive(Debug, Clone, Default)]
pub(crate) struct CallLog(Option<Arc<Mutex<Vec<CallRecord>>>>);

impl CallLog {
    /// A log that keeps what it is given.
    pub(crate) fn recording() -> Self {
        Self(Some(Arc::default()))
    }

    fn push(&self, record: impl FnOnce() -> CallRecord) {
        if let Some(log) = &self.0 {
            log.lock().unwrap_or_else(|p| p.into_inner()).push(record());
        }
    }

    /// The decisions recorded so far (in the order they were made), leaving the log empty.
    pub(crate) fn take(&self) -> Vec<CallRecord> {
        match &self.0 {
            Some(log) => std::mem::take(&mut *log.lock().unwrap_or_else(|p| p.into_inner())),
            None => Vec::new(),
        }
    }
}

/// Why a call waiting for approval was rejected when its execution was cancelled.
const CANCELLED: &str = "the execution was cancelled";

/// Requests attached to no call (deciding them does nothing), for tests of how surfaces render
/// requests (the MCP question is in the binary).
#[doc(hidden)]
pub mod testing {
    use super::*;

    /// A tool call `server.tool(arguments)`; `arguments` must be a JSON object.
    pub fn tool_call(server: &str, tool: &str, arguments: Value) -> ApprovalRequest {
        detached(server, tool, arguments, RequestKind::ToolCall)
    }

    /// A shell command (with `magic`, a cell magic's cell).
    pub fn shell(cmd: &str, magic: Option<&str>) -> ApprovalRequest {
        let mut arguments = serde_json::json!({"cmd": cmd});
        let tool = match magic {
            Some(magic) => {
                arguments["magic"] = magic.into();
                SHELL_MAGIC_TOOL
            }
            None => SHELL_TOOL,
        };
        detached(
            SHELL_SERVER_NAME,
            tool,
            arguments,
            RequestKind::ShellCommand,
        )
    }

    fn detached(server: &str, tool: &str, arguments: Value, kind: RequestKind) -> ApprovalRequest {
        ApprovalRequest {
            server_name: server.into(),
            tool_name: tool.into(),
            arguments: match arguments {
                Value::Object(map) => map,
                _ => Map::new(),
            },
            server_command: None,
            server_identity: None,
            kind,
            reply: Vec::new(),
            slot: None,
            question: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ask(
        policy: &ApprovalPolicy,
        arguments: Value,
        timeout: Duration,
    ) -> tokio::task::JoinHandle<Decision> {
        let policy = policy.clone();
        tokio::spawn(async move {
            let Value::Object(arguments) = arguments else {
                unreachable!()
            };
            let subject = Subject {
                server_name: "fx",
                tool_name: "add",
                arguments: &arguments,
                kind: RequestKind::ToolCall,
                server: None,
            };
            decide(
                &policy,
                subject,
                timeout,
                &TimeoutPause::default(),
                None,
                &CallLog::default(),
            )
            .await
        })
    }

    async fn settle() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    fn drain(rx: &mut mpsc::UnboundedReceiver<ApprovalRequest>) -> Vec<ApprovalRequest> {
        std::iter::from_fn(|| rx.try_recv().ok()).collect()
    }

    #[tokio::test]
    async fn at_most_eight_prompts_wait_and_queued_duplicates_are_asked_once() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let policy = ApprovalPolicy::ask(tx, CancellationToken::new());
        let long = Duration::from_secs(60);
        let mut first: Vec<_> = (0..8)
            .map(|i| ask(&policy, json!({"a": i}), long))
            .collect();
        settle().await;
        let same: Vec<_> = (0..6)
            .map(|_| ask(&policy, json!({"a": 100}), long))
            .collect();
        let other = ask(&policy, json!({"a": 8}), long);
        settle().await;
        let shown = drain(&mut rx);
        assert_eq!(shown.len(), MAX_OUTSTANDING_PROMPTS);
        assert_eq!(shown[0].describe(), "fx.add(a=0)");
        // Deciding one lets the next queued call in: the six identical ones, asked once.
        let mut shown = shown.into_iter();
        shown.next().unwrap().accept();
        settle().await;
        let next = drain(&mut rx);
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].calls(), 6);
        assert_eq!(next[0].describe(), "fx.add(a=100) [6 identical calls]");
        next.into_iter().next().unwrap().reject();
        for decided in same {
            assert_eq!(decided.await.unwrap(), Decision::Rejected(None));
        }
        settle().await;
        let last = drain(&mut rx);
        assert_eq!(last.len(), 1);
        assert_eq!(last[0].describe(), "fx.add(a=8)");
        // Dropping a request rejects it and frees its place too.
        drop(last);
        assert_eq!(other.await.unwrap(), Decision::Rejected(None));
        assert_eq!(first.remove(0).await.unwrap(), Decision::Accepted);
        for request in shown {
            request.accept();
        }
        for decided in first {
            assert_eq!(decided.await.unwrap(), Decision::Accepted);
        }
    }

    /// Fills the eight outstanding places, queues `queued` (as JSON texts, parsed the way the
    /// tool server parses a kernel's request), accepts the eight, and returns what is asked next
    /// (rendered, with how many calls each decides), deciding each so the queue moves on.
    async fn asked_after_the_first_eight(queued: &[&str]) -> Vec<(String, usize)> {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let policy = ApprovalPolicy::ask(tx, CancellationToken::new());
        let long = Duration::from_secs(60);
        let held: Vec<_> = (0..8)
            .map(|i| ask(&policy, json!({"a": i}), long))
            .collect();
        settle().await;
        let waiting: Vec<_> = queued
            .iter()
            .map(|text| ask(&policy, serde_json::from_str(text).unwrap(), long))
            .collect();
        settle().await;
        for request in drain(&mut rx) {
            request.accept();
        }
        let mut asked = Vec::new();
        while asked.iter().map(|(_, n)| n).sum::<usize>() < queued.len() {
            settle().await;
            let next = drain(&mut rx);
            assert!(!next.is_empty(), "nothing more was asked after {asked:?}");
            for request in next {
                asked.push((request.describe(), request.calls()));
                request.accept();
            }
        }
        for decided in held.into_iter().chain(waiting) {
            assert_eq!(decided.await.unwrap(), Decision::Accepted);
        }
        asked
    }

    #[tokio::test]
    async fn queued_calls_merge_only_when_identical_as_sent() {
        // Equal as JSON values, different on the wire: asked about apart, each as it runs.
        let asked = asked_after_the_first_eight(&[
            r#"{"x": 0.0}"#,
            r#"{"x": -0.0}"#,
            r#"{"x": 1}"#,
            r#"{"x": 1.0}"#,
            r#"{"a": 1, "b": 2}"#,
            r#"{"b": 2, "a": 1}"#,
        ])
        .await;
        let shown: Vec<&str> = asked.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(
            shown,
            [
                "fx.add(x=0.0)",
                "fx.add(x=-0.0)",
                "fx.add(x=1)",
                "fx.add(x=1.0)",
                "fx.add(a=1, b=2)",
                "fx.add(b=2, a=1)",
            ]
        );
        assert!(asked.iter().all(|(_, calls)| *calls == 1), "{asked:?}");
        // Identical bytes: one prompt that says so.
        let asked =
            asked_after_the_first_eight(&[r#"{"x": -0.0}"#, r#"{"x": -0.0}"#, r#"{"x": -0.0}"#])
                .await;
        assert_eq!(
            asked,
            [("fx.add(x=-0.0) [3 identical calls]".to_string(), 3)]
        );
    }

    #[tokio::test]
    async fn a_queued_call_times_out_and_gives_up_its_place() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let policy = ApprovalPolicy::ask(tx, CancellationToken::new());
        let held: Vec<_> = (0..8)
            .map(|i| ask(&policy, json!({"a": i}), Duration::from_secs(60)))
            .collect();
        let queued = ask(&policy, json!({"a": 9}), Duration::from_millis(100));
        assert_eq!(queued.await.unwrap(), Decision::TimedOut);
        let shown = drain(&mut rx);
        assert_eq!(shown.len(), 8);
        let late = ask(&policy, json!({"a": 10}), Duration::from_secs(60));
        for request in shown {
            request.accept();
        }
        settle().await;
        // The timed-out call is skipped; the later one is asked.
        let next = drain(&mut rx);
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].describe(), "fx.add(a=10)");
        next.into_iter().for_each(ApprovalRequest::accept);
        assert_eq!(late.await.unwrap(), Decision::Accepted);
        for decided in held {
            assert_eq!(decided.await.unwrap(), Decision::Accepted);
        }
    }

    #[test]
    fn requests_that_cannot_be_shown_whole_are_refused() {
        let args = |v: Value| match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        };
        let long_name = format!("{}a", "\u{200b}".repeat(1500));
        let long_arg = args(json!({ long_name.clone(): 1000000, "b": 2 }));
        let subject = |server, tool, arguments, kind| Subject {
            server_name: server,
            tool_name: tool,
            arguments,
            kind,
            server: None,
        };
        let reason = unshowable(
            &subject("fx", "add", &long_arg, RequestKind::ToolCall),
            None,
        );
        assert_eq!(
            reason.as_deref(),
            Some(
                "its argument name is 1501 characters long, over the limit of 128 for names in an approval prompt (nothing in an approval prompt is ever cut, so a request that cannot be shown whole is refused before anyone is asked)\n  help: use the names the server declares"
            )
        );
        let empty = Map::new();
        let reason = unshowable(
            &subject("fx", &long_name, &empty, RequestKind::ToolCall),
            None,
        );
        assert!(
            reason
                .unwrap()
                .starts_with("its tool name is 1501 characters long")
        );
        let ok = args(json!({"a": 1, "b": "x".repeat(100)}));
        assert_eq!(
            unshowable(&subject("fx", "add", &ok, RequestKind::ToolCall), Some(117)),
            None
        );
        let reason = unshowable(&subject("fx", "add", &ok, RequestKind::ToolCall), Some(116));
        assert!(
            reason
                .unwrap()
                .starts_with("it is 117 characters long when shown, over the limit of 116")
        );
        let padded = args(json!({"cmd": format!("echo hi{}; touch x", "\u{200b}".repeat(1500))}));
        let reason = unshowable(
            &subject("ipybox", "shell", &padded, RequestKind::ShellCommand),
            Some(shown::HUMAN_TEXT_LIMIT),
        );
        assert_eq!(
            reason, None,
            "12 000 characters of escapes fit in a prompt, whole"
        );
    }
}
