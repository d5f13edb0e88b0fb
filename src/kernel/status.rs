//! What every kernel transport and launcher shares, below all of them: how a kernel ended
//! ([`ExitInfo`], worded by [`describe_exit`] and [`describe_code`]) and how a failed start is
//! reported ([`start_err`]). A leaf of `kernel/`: it imports nothing of its siblings, so
//! `local`, `factory`, `gateway`, `instance` and `launch` can all use it without importing each
//! other.
//!
//! Not here: noticing that a kernel ended (each transport watches its own kind of process or
//! connection).

use super::KernelError;

/// How a child ended, in words: a leaf below both `kernel` and `confine` (`child_process`).
pub(crate) use crate::child_process::{describe_code, describe_exit};

/// How a kernel ended, as shown to the user: `exit code 3`, `killed by signal 9 (SIGKILL)`, or
/// what a Jupyter server said.
#[derive(Debug, Clone)]
pub(crate) struct ExitInfo(pub String);

/// A start failure whose fix is usually the kernel environment.
pub(crate) fn start_err(reason: String) -> KernelError {
    start_err_help(
        reason,
        "run `ipybox setup` to check the kernel environment, or pass --python PATH",
    )
}

/// A start failure with its own advice.
pub(crate) fn start_err_help(reason: String, help: &str) -> KernelError {
    KernelError::Start {
        reason,
        help: help.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_and_signals_read_the_same_from_either_source() {
        use std::os::unix::process::ExitStatusExt;
        // A wait status: exit code in the second byte, a signal in the low bits.
        assert_eq!(
            describe_exit(std::process::ExitStatus::from_raw(3 << 8)),
            describe_code(3)
        );
        assert_eq!(
            describe_exit(std::process::ExitStatus::from_raw(libc::SIGKILL)),
            describe_code(-libc::SIGKILL)
        );
        assert_eq!(describe_code(-9), "killed by signal 9 (SIGKILL)");
        assert_eq!(describe_code(0), "exit code 0");
        // Whatever the template reports (it may be hostile code) is worded, never a panic.
        assert_eq!(describe_code(i32::MIN), "killed by signal 2147483648");
    }
}
