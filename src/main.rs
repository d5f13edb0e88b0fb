//! The `ipybox` binary: the MCP server (default, on stdio) and human-facing subcommands. This
//! file parses the command line and dispatches: the flags' types are in `flags`, the server in
//! `serve`, the other subcommands in `commands`.
//!
//! stdout carries program output only (for the MCP server: the protocol); logs go to stderr.

use std::process::ExitCode;
use std::time::Duration;

mod commands;
mod dotenv;
mod flags;
mod http;
mod logging;
mod mcp_server;
mod metrics;
mod own_secrets;
mod replay;
mod serve;
mod terminal_approval;
mod trust_command;

use clap::Parser;
use flags::{Cli, Command};

/// Logs to stderr at `level` for ipybox (`IPYBOX_LOG`, an env-filter directive, overrides),
/// never code, output or handles (see [`logging`]); once per process, later calls do nothing.
/// The Python package's logging setup (`crates/ipybox-py` compiles this file in).
#[allow(dead_code)] // used by the wheel only
pub(crate) fn init_logging(level: &str) {
    logging::init(level, false);
}

pub(crate) const SUCCESS: u8 = 0;
pub(crate) const FAILURE: u8 = 1;
/// A command line clap or [`flags::flags_before_subcommand`] refuses (clap's own status for it).
const USAGE: u8 = 2;

fn main() -> ExitCode {
    ExitCode::from(cli_main(std::env::args_os()))
}

/// The whole command line: `args` as `std::env::args_os()` gives them (program name first);
/// returns the exit status. Also the entry point of the Python package's `ipybox` command,
/// which compiles this module into its extension (see crates/ipybox-py).
pub(crate) fn cli_main<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    let args = match flags::flags_before_subcommand(args) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("error: {message}");
            return USAGE;
        }
    };
    let cli = Cli::parse_from(args);
    let default_level = match cli.command {
        None | Some(Command::Serve { .. }) => "info",
        Some(_) => "warn",
    };
    logging::init(
        cli.log_level.as_deref().unwrap_or(default_level),
        cli.log_content,
    );
    // Before any thread starts: ipybox's secrets leave its environment and command line, and no
    // other process of its user may read its memory (own_secrets.rs).
    let secrets = own_secrets::take();
    // Never in a notebook or a log line (redact.rs).
    if let Some(token) = &secrets.token {
        ipybox::redact::register("IPYBOX_TOKEN", token);
    }
    if let Some(key) = &secrets.session_secret {
        ipybox::redact::register("IPYBOX_SESSION_SECRET", key);
    }
    own_secrets::no_dumps();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return FAILURE;
        }
    };
    let stdio_server = match &cli.command {
        None => true,
        Some(Command::Serve { http, .. }) => http.http.is_none(),
        Some(_) => false,
    };
    // (A flag given before a subcommand was moved after it: `cli.serve` holds only defaults
    // then.)
    let result = match cli.command {
        Some(Command::Serve { serve: args, http }) => {
            runtime.block_on(serve::serve(*args, Some(*http), secrets))
        }
        Some(command) => runtime.block_on(commands::run(command)),
        None => runtime.block_on(serve::serve(cli.serve, None, secrets)),
    };
    // Leftover blocking tasks (e.g. a terminal prompt) must not keep the process alive; the
    // wait lets the workers drop the tasks left (their children are killed on drop). A stdio
    // server whose checkpoint or restore was under way (mcp_server/resume.rs; it runs while the
    // session is idle) waits less: its store write on a blocking thread would hold the exit for
    // the whole wait, past the 100 ms budget, and is abandoned instead (the store keeps the
    // previous snapshot whole).
    let wait = if stdio_server && mcp_server::snapshot_in_flight() {
        Duration::from_millis(20)
    } else {
        Duration::from_millis(100)
    };
    runtime.shutdown_timeout(wait);
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", error_text(&e));
            FAILURE
        }
    }
}

/// An error and its causes, as `{e:#}` shows them, but a cause the message already says is not
/// repeated, and causes go before the message's `help:` line (never after the advice).
fn error_text(e: &anyhow::Error) -> String {
    let message = e.to_string();
    let (first, help) = match message.find("\n  help:") {
        Some(at) => message.split_at(at),
        None => (message.as_str(), ""),
    };
    let mut text = first.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !message.contains(&cause) && !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text + help
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cause_goes_before_the_help_and_is_said_once() {
        let io = std::io::Error::new(
            std::io::ErrorKind::NotADirectory,
            "Not a directory (os error 20)",
        );
        let e = anyhow::Error::new(io)
            .context("cannot prepare /x/y\n  help: choose a writable directory");
        assert_eq!(
            super::error_text(&e),
            "cannot prepare /x/y: Not a directory (os error 20)\n  help: choose a writable directory"
        );
        let said = anyhow::anyhow!("inner").context("outer: inner");
        assert_eq!(super::error_text(&said), "outer: inner");
    }
}
