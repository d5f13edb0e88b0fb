//! Terminal approvals for `ipybox exec`: each MCP tool call (and shell command, with
//! `--approve-shell`) is shown on stderr and answered on
//! the controlling terminal (`/dev/tty`, so code can still come from stdin). `--yes` accepts all;
//! without a terminal every call is rejected with a message saying to pass `--yes`.

use std::io::{BufRead, Write};

use ipybox::tools::ApprovalRequest;

pub(crate) struct TerminalApprover {
    yes: bool,
    warned: bool,
}

impl TerminalApprover {
    pub(crate) fn new(yes: bool) -> Self {
        Self { yes, warned: false }
    }

    pub(crate) async fn decide(&mut self, request: ApprovalRequest) {
        if self.yes {
            request.accept();
            return;
        }
        let what = if request.is_shell_command() {
            ""
        } else {
            "tool call "
        };
        let prompt = format!("ipybox: approve {what}{}? [y/N] ", request.describe());
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
