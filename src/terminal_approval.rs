//! Terminal approvals for `ipybox exec`: each MCP tool call (and shell command, with
//! `--approve-shell`) is shown on stderr and answered on
//! the controlling terminal (`/dev/tty`, so code can still come from stdin). `--yes` accepts all;
//! without a terminal every call is rejected with a message saying to pass `--yes`.
//!
//! The prompt is [`ApprovalRequest::describe`] (names and strings escaped, a multi-line command
//! line by line with `| `, nothing cut; `ipybox exec` refuses requests too long to show, see
//! `ipybox::tools::shown::HUMAN_TEXT_LIMIT`), so nothing a kernel sends can move the cursor,
//! recolour the terminal or print a line that passes for a prompt.
//!
//! [`print_execution`] is the terminal side of one execution for both `ipybox exec` and
//! `ipybox replay`: its output on stdout as it arrives, its approvals asked here.

use std::io::{BufRead, Write};

use ipybox::executor::{Execution, ExecutionEvent, ExecutionResult, ExecutorError};
use ipybox::tools::ApprovalRequest;

/// Prints `execution`'s output on stdout as it arrives (text as is, an image as
/// `[image: <path>]`), asks `approver` about each approval request, ends the output with a
/// newline if it did not end with one, and returns the result (`None`: the execution ended
/// without one).
pub(crate) async fn print_execution(
    mut execution: Execution,
    approver: &mut TerminalApprover,
) -> std::io::Result<Option<Result<ExecutionResult, ExecutorError>>> {
    let mut stdout = std::io::stdout();
    let mut result = None;
    let mut needs_newline = false;
    while let Some(event) = execution.next().await {
        match event {
            ExecutionEvent::Chunk(text) => {
                stdout.write_all(text.as_bytes())?;
                stdout.flush()?;
                needs_newline = !text.ends_with('\n');
            }
            ExecutionEvent::Image(path) => writeln!(stdout, "[image: {}]", path.display())?,
            ExecutionEvent::Approval(request) => approver.decide(request).await,
            ExecutionEvent::Result(r) => result = Some(r),
        }
    }
    if needs_newline {
        writeln!(stdout)?;
    }
    Ok(result)
}

pub(crate) struct TerminalApprover {
    yes: bool,
    warned: bool,
}

impl TerminalApprover {
    pub(crate) fn new(yes: bool) -> Self {
        Self { yes, warned: false }
    }

    pub(crate) async fn decide(&mut self, mut request: ApprovalRequest) {
        if self.yes {
            request.accept_unasked();
            return;
        }
        let what = if request.is_shell_command() {
            ""
        } else {
            "tool call "
        };
        let prompt = prompt(what, &request);
        // What the user saw (a session notebook records it with the answer).
        request.shown_as(prompt.trim_end_matches(" [y/N] ").trim_end());
        let answer = tokio::task::spawn_blocking(move || ask_tty(&prompt))
            .await
            .ok()
            .flatten();
        match answer {
            Some(true) => request.accept(),
            Some(false) => request.reject(),
            None => {
                if !self.warned {
                    eprintln!(
                        "ipybox: rejected {what}{}: no terminal to ask for approval\n  help: pass --yes to approve all tool calls and shell commands",
                        request.describe()
                    );
                    self.warned = true;
                }
                request.reject();
            }
        }
    }
}

/// The question: `ipybox: approve tool call fx.add(a=1)? [y/N] `; a multi-line request ends
/// with its last line and the question goes on a line of its own. A tool call is preceded by
/// the registered server's command line or URL (what the call reaches).
fn prompt(what: &str, request: &ApprovalRequest) -> String {
    let described = request.describe();
    let server = request
        .server_command
        .as_deref()
        .map(|cmd| {
            format!(
                "ipybox: MCP server {} is {}\n",
                ipybox::tools::shown::name(
                    &request.server_name,
                    ipybox::tools::shown::Syntax::Json
                ),
                ipybox::tools::shown::command(cmd)
            )
        })
        .unwrap_or_default();
    if described.contains('\n') {
        format!("{server}ipybox: approve {what}{described}\napprove? [y/N] ")
    } else {
        format!("{server}ipybox: approve {what}{described}? [y/N] ")
    }
}

/// `Some(answer)` from the terminal, `None` if there is no terminal.
fn ask_tty(prompt: &str) -> Option<bool> {
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .ok()?;
    let mut out = tty.try_clone().ok()?;
    out.write_all(prompt.as_bytes()).ok()?;
    out.flush().ok()?;
    let mut line = String::new();
    std::io::BufReader::new(tty).read_line(&mut line).ok()?;
    Some(matches!(
        line.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipybox::tools::testing;

    #[test]
    fn prompts_show_requests_escaped_and_whole() {
        let cases = [
            (
                testing::tool_call("fx", "add", serde_json::json!({"a": 1, "b": 2})),
                "ipybox: approve tool call fx.add(a=1, b=2)? [y/N] ",
            ),
            (
                testing::tool_call(
                    "fx",
                    "add",
                    serde_json::json!({"b": 2, "x\u{8}\u{8}\u{8}a": 1}),
                ),
                "ipybox: approve tool call fx.add(b=2, \"x\\u0008\\u0008\\u0008a\"=1)? [y/N] ",
            ),
            (
                testing::shell("echo hi; \u{1b}[2K\rtouch x", None),
                "ipybox: approve shell command `echo hi; \\u{1b}[2K\\u{d}touch x`? [y/N] ",
            ),
            (
                testing::shell("echo a\necho b\n", Some("%%bash")),
                "ipybox: approve %%bash cell:\n| echo a\n| echo b\napprove? [y/N] ",
            ),
        ];
        for (request, expected) in cases {
            let what = if request.is_shell_command() {
                ""
            } else {
                "tool call "
            };
            assert_eq!(prompt(what, &request), expected);
        }
    }
}
