//! One cell being recorded: its code, the outputs its execution emitted (the same events the
//! caller gets, so what the notebook shows went through the same caps), and, once it ended, its
//! status, duration and approval decisions, made into a notebook cell.
//!
//! Text is kept up to a limit per cell: the caller's (the MCP tool's `max_output_chars`, so the
//! notebook is no way around it), else [`MAX_CELL_TEXT_CHARS`]; what is cut is said in the cell.
//! Consecutive stream text of one stream becomes one output, as Jupyter shows it.
//!
//! Not here: where cells go ([`super::Notebook`]), the JSON shapes ([`super::format`]).

use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use serde_json::{Map, Value, json};

use super::format;
use crate::kernel::{ExecEvent, KernelError, Source};
use crate::tools::{Answer, CallRecord};

/// The most characters of text a cell keeps when its caller set no limit.
pub const MAX_CELL_TEXT_CHARS: usize = 1_000_000;

/// The largest arguments of one tool call kept in a cell's metadata (bytes of JSON); larger
/// ones are left out, and their size is said.
pub const MAX_RECORDED_ARGUMENT_BYTES: usize = 256 * 1024;

/// The most approval decisions one cell keeps; beyond, how many were left out is said.
pub const MAX_RECORDED_CALLS: usize = 1000;

/// How a cell ended, in the words of its `ipybox.status` metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// The code raised an exception.
    Error,
    /// The code was interrupted from inside (`KeyboardInterrupt`).
    Interrupted,
    /// It ran out of time and was interrupted (or its kernel restarted).
    TimedOut,
    /// Its caller cancelled it (the kernel was interrupted).
    Cancelled,
    /// The kernel died under it (or before it: then it did not run).
    KernelDied,
    /// Something else failed (the kernel could not be reached).
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Error => "error",
            Status::Interrupted => "interrupted",
            Status::TimedOut => "timed out",
            Status::Cancelled => "cancelled",
            Status::KernelDied => "kernel died",
            Status::Failed => "failed",
        }
    }
}

/// How an execution ended, as the notebook needs to know it (the executor says): owned, so
/// that the cell can be recorded after its result went to the caller.
#[derive(Debug)]
pub(crate) enum Ending {
    Ok,
    /// The code raised (`KeyboardInterrupt`: it was interrupted).
    Raised {
        ename: String,
        evalue: String,
        traceback: String,
    },
    /// Anything else: its status, whether the kernel was replaced after it, and the message the
    /// caller got (what ran out, what was kept).
    Other {
        status: Status,
        kernel_replaced: bool,
        message: String,
    },
}

impl Ending {
    /// The kernel's error (the code raised, timed out, or the kernel died).
    pub(crate) fn kernel(e: &KernelError) -> Self {
        let other = |status, kernel_replaced| Self::Other {
            status,
            kernel_replaced,
            message: e.to_string(),
        };
        match e {
            KernelError::Failed {
                ename,
                evalue,
                traceback,
                ..
            } => Self::Raised {
                ename: ename.clone(),
                evalue: evalue.clone(),
                traceback: traceback.clone(),
            },
            KernelError::Timeout { state_kept, .. } => other(Status::TimedOut, !state_kept),
            KernelError::Died { .. } => other(Status::KernelDied, true),
            _ => other(Status::Failed, false),
        }
    }

    /// Cancelled by its caller; the message the caller got.
    pub(crate) fn cancelled(message: String) -> Self {
        Self::Other {
            status: Status::Cancelled,
            kernel_replaced: false,
            message,
        }
    }

    /// Anything else; the message the caller got.
    pub(crate) fn other(message: String) -> Self {
        Self::Other {
            status: Status::Failed,
            kernel_replaced: false,
            message,
        }
    }
}

/// What a cell's execution printed or displayed, in order.
#[derive(Debug)]
enum Output {
    Stream {
        name: &'static str,
        text: String,
    },
    /// The text/plain of an `execute_result` (`result`) or `display_data`.
    Text {
        result: bool,
        text: String,
    },
    Image {
        result: bool,
        png: Vec<u8>,
    },
    Error {
        ename: String,
        evalue: String,
        traceback: String,
    },
}

/// A cell while it runs.
#[derive(Debug)]
pub(crate) struct CellRecord {
    code: String,
    started: SystemTime,
    clock: Instant,
    timeout: Option<Duration>,
    /// The caller's limit on text, if it set one (recorded, for `ipybox replay`).
    caller_limit: Option<usize>,
    limit: usize,
    used: usize,
    truncated: bool,
    outputs: Vec<Output>,
}

/// A finished cell, as the notebook keeps it.
pub(crate) struct Finished {
    pub(crate) cell: Value,
    pub(crate) status: Status,
    /// Whether the kernel that ran it was replaced after it (its state is gone).
    pub(crate) kernel_replaced: bool,
}

impl CellRecord {
    pub(crate) fn new(code: &str, timeout: Option<Duration>, max_chars: Option<usize>) -> Self {
        Self {
            code: code.to_string(),
            started: SystemTime::now(),
            clock: Instant::now(),
            timeout,
            caller_limit: max_chars,
            limit: max_chars
                .unwrap_or(MAX_CELL_TEXT_CHARS)
                .min(MAX_CELL_TEXT_CHARS),
            used: 0,
            truncated: false,
            outputs: Vec::new(),
        }
    }

    /// Takes in one event of the execution.
    pub(crate) fn observe(&mut self, event: &ExecEvent) {
        match event {
            ExecEvent::Output(source, text) => {
                let Some(text) = self.keep(text) else { return };
                match source {
                    Source::Stdout | Source::Stderr => {
                        let name = if *source == Source::Stdout {
                            "stdout"
                        } else {
                            "stderr"
                        };
                        match self.outputs.last_mut() {
                            Some(Output::Stream {
                                name: last,
                                text: t,
                            }) if *last == name => t.push_str(&text),
                            _ => self.outputs.push(Output::Stream { name, text }),
                        }
                    }
                    Source::Result | Source::Display => {
                        // The caller's text ends every rich output with a newline; the bundle
                        // holds the repr as Jupyter sent it.
                        let text = text.strip_suffix('\n').unwrap_or(&text).to_string();
                        self.outputs.push(Output::Text {
                            result: *source == Source::Result,
                            text,
                        });
                    }
                }
            }
            ExecEvent::Image(source, _, png) => self.outputs.push(Output::Image {
                result: *source == Source::Result,
                png: png.clone(),
            }),
        }
    }

    /// The part of `text` within the cell's limit (`None`: nothing); the first cut adds a note.
    fn keep(&mut self, text: &str) -> Option<String> {
        if self.truncated {
            return None;
        }
        let room = self.limit - self.used;
        match text.char_indices().nth(room) {
            None => {
                self.used += text.chars().count();
                Some(text.to_string())
            }
            Some((cut, _)) => {
                self.used = self.limit;
                self.truncated = true;
                let head = &text[..cut];
                if !head.is_empty() {
                    self.outputs.push(Output::Stream {
                        name: "stdout",
                        text: head.to_string(),
                    });
                }
                self.outputs.push(Output::Stream {
                    name: "stderr",
                    text: format!(
                        "\n[Output truncated: exceeded {} character limit]\n",
                        self.limit
                    ),
                });
                None
            }
        }
    }

    /// The cell, once its execution ended (`ending`) after the decisions in `calls`.
    pub(crate) fn finish(
        mut self,
        id: &str,
        count: u32,
        ending: &Ending,
        calls: Vec<CallRecord>,
    ) -> Finished {
        let duration = self.clock.elapsed();
        let (status, kernel_replaced) = status(ending);
        match ending {
            Ending::Ok => {}
            Ending::Raised {
                ename,
                evalue,
                traceback,
            } => {
                let traceback = self.keep(traceback).unwrap_or_default();
                self.outputs.push(Output::Error {
                    ename: ename.clone(),
                    evalue: evalue.clone(),
                    traceback,
                });
            }
            // The message the caller got (what ran out, what was kept), always whole.
            Ending::Other { message, .. } => self.outputs.push(Output::Stream {
                name: "stderr",
                text: format!("{message}\n"),
            }),
        }
        let outputs = self.outputs.iter().map(|o| output_json(o, count)).collect();
        let mut metadata = json!({
            "status": status.as_str(),
            "started": format::utc(self.started),
            "duration": round_secs(duration),
        });
        if let Some(timeout) = self.timeout {
            metadata["timeout"] = round_secs(timeout).into();
        }
        if let Some(limit) = self.caller_limit {
            metadata["output_limit"] = limit.into();
        }
        if self.truncated {
            metadata["output_truncated"] = true.into();
        }
        if kernel_replaced {
            metadata["kernel_restarted"] = true.into();
        }
        let (tools, shells): (Vec<_>, Vec<_>) = calls.into_iter().partition(|c| !c.shell);
        for (key, records) in [("tool_calls", tools), ("shell_commands", shells)] {
            if records.is_empty() {
                continue;
            }
            let left_out = records.len().saturating_sub(MAX_RECORDED_CALLS);
            let list: Vec<Value> = records
                .iter()
                .take(MAX_RECORDED_CALLS)
                .map(call_json)
                .collect();
            metadata[key] = list.into();
            if left_out > 0 {
                metadata[format!("{key}_left_out")] = left_out.into();
            }
        }
        Finished {
            cell: format::code_cell(id, &self.code, count, outputs, metadata),
            status,
            kernel_replaced,
        }
    }
}

/// A cell's status, and whether its kernel was replaced after it.
fn status(ending: &Ending) -> (Status, bool) {
    match ending {
        Ending::Ok => (Status::Ok, false),
        Ending::Raised { ename, .. } if ename == "KeyboardInterrupt" => {
            (Status::Interrupted, false)
        }
        Ending::Raised { .. } => (Status::Error, false),
        Ending::Other {
            status,
            kernel_replaced,
            ..
        } => (*status, *kernel_replaced),
    }
}

fn output_json(output: &Output, count: u32) -> Value {
    match output {
        Output::Error {
            ename,
            evalue,
            traceback,
        } => format::error(ename, evalue, traceback),
        Output::Stream { name, text } => format::stream(name, text),
        Output::Text { result, text } => format::rich(result.then_some(count), "text/plain", text),
        Output::Image { result, png } => format::rich(
            result.then_some(count),
            "image/png",
            &base64::engine::general_purpose::STANDARD.encode(png),
        ),
    }
}

fn call_json(call: &CallRecord) -> Value {
    let mut entry = Map::new();
    if call.shell {
        let cmd = call.arguments.get("cmd").cloned().unwrap_or(Value::Null);
        entry.insert("command".into(), cmd);
        if let Some(magic) = call.arguments.get("magic") {
            entry.insert("magic".into(), magic.clone());
        }
    } else {
        entry.insert("server".into(), call.server_name.clone().into());
        entry.insert("tool".into(), call.tool_name.clone().into());
        let size = serde_json::to_vec(&call.arguments).map_or(0, |b| b.len());
        if size <= MAX_RECORDED_ARGUMENT_BYTES {
            entry.insert("arguments".into(), Value::Object(call.arguments.clone()));
        } else {
            entry.insert("arguments".into(), Value::Null);
            entry.insert(
                "arguments_left_out".into(),
                format!("{size} bytes of JSON, over the {MAX_RECORDED_ARGUMENT_BYTES} a notebook keeps per call").into(),
            );
        }
    }
    if let Some(question) = &call.question {
        entry.insert("question".into(), question.clone().into());
    }
    entry.insert("answer".into(), call.answer.as_str().into());
    if let Some(reason) = &call.reason {
        entry.insert("reason".into(), reason.clone().into());
    }
    if call.answer != Answer::AutoAccepted {
        entry.insert("waited".into(), round_secs(call.waited).into());
    }
    Value::Object(entry)
}

/// Seconds, to the microsecond.
fn round_secs(d: Duration) -> f64 {
    (d.as_micros().min(u64::MAX as u128) as u64) as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn out(source: Source, text: &str) -> ExecEvent {
        ExecEvent::Output(source, text.into())
    }

    #[test]
    fn streams_merge_and_results_keep_their_kind() {
        let mut cell = CellRecord::new("x", None, None);
        cell.observe(&out(Source::Stdout, "a\n"));
        cell.observe(&out(Source::Stdout, "b\n"));
        cell.observe(&out(Source::Stderr, "w\n"));
        cell.observe(&ExecEvent::Image(
            Source::Display,
            PathBuf::from("/i.png"),
            vec![137, 80],
        ));
        cell.observe(&out(Source::Result, "42\n"));
        let done = cell.finish("c1", 3, &Ending::Ok, vec![]);
        assert_eq!(done.status, Status::Ok);
        assert_eq!(
            done.cell["outputs"],
            json!([
                {"output_type": "stream", "name": "stdout", "text": "a\nb\n"},
                {"output_type": "stream", "name": "stderr", "text": "w\n"},
                {"output_type": "display_data", "data": {"image/png": "iVA="}, "metadata": {}},
                {"output_type": "execute_result", "execution_count": 3, "data": {"text/plain": "42"}, "metadata": {}},
            ])
        );
        assert_eq!(done.cell["metadata"]["ipybox"]["status"], "ok");
    }

    #[test]
    fn text_past_the_limit_is_cut_and_said() {
        let mut cell = CellRecord::new("x", Some(Duration::from_secs(5)), Some(5));
        cell.observe(&out(Source::Stdout, "héllo world"));
        cell.observe(&out(Source::Stdout, "more"));
        let error = KernelError::Failed {
            ename: "ValueError".into(),
            evalue: "bad".into(),
            traceback: "Traceback\nValueError: bad".into(),
            output: String::new(),
        };
        let done = cell.finish("c1", 1, &Ending::kernel(&error), vec![]);
        assert_eq!(done.status, Status::Error);
        assert_eq!(
            done.cell["outputs"],
            json!([
                {"output_type": "stream", "name": "stdout", "text": "héllo"},
                {"output_type": "stream", "name": "stderr", "text": "\n[Output truncated: exceeded 5 character limit]\n"},
                {"output_type": "error", "ename": "ValueError", "evalue": "bad", "traceback": []},
            ])
        );
        let meta = &done.cell["metadata"]["ipybox"];
        assert_eq!(meta["output_truncated"], true);
        assert_eq!(meta["output_limit"], 5);
        assert_eq!(meta["timeout"], 5.0);
    }

    #[test]
    fn decisions_are_recorded_with_their_answers() {
        let args = |v: Value| match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        };
        let call = |shell, arguments, answer, question: Option<&str>| CallRecord {
            shell,
            server_name: if shell { "ipybox" } else { "fx" }.into(),
            tool_name: if shell { "shell" } else { "add" }.into(),
            arguments,
            question: question.map(str::to_string),
            answer,
            reason: None,
            waited: Duration::from_millis(1500),
        };
        let calls = vec![
            call(
                false,
                args(json!({"a": 1})),
                Answer::Accepted,
                Some("fx.add(a=1)"),
            ),
            call(false, args(json!({"a": 2})), Answer::AutoAccepted, None),
            call(
                true,
                args(json!({"cmd": "ls"})),
                Answer::Declined,
                Some("shell command `ls`"),
            ),
        ];
        let timeout = KernelError::Timeout {
            seconds: 1.0,
            state_kept: false,
            output: String::new(),
        };
        let done =
            CellRecord::new("x", None, None).finish("c1", 1, &Ending::kernel(&timeout), calls);
        assert_eq!(done.status, Status::TimedOut);
        assert!(done.kernel_replaced);
        let meta = &done.cell["metadata"]["ipybox"];
        assert_eq!(
            meta["tool_calls"],
            json!([
                {"server": "fx", "tool": "add", "arguments": {"a": 1}, "question": "fx.add(a=1)", "answer": "accepted", "waited": 1.5},
                {"server": "fx", "tool": "add", "arguments": {"a": 2}, "answer": "auto-accepted"},
            ])
        );
        assert_eq!(
            meta["shell_commands"],
            json!([{"command": "ls", "question": "shell command `ls`", "answer": "declined", "waited": 1.5}])
        );
        assert_eq!(meta["kernel_restarted"], true);
        assert_eq!(
            done.cell["outputs"][0]["text"],
            "execution timed out after 1 s and did not stop when interrupted — kernel restarted, state lost\n"
        );
    }
}
