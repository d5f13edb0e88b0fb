//! What every child process ipybox starts shares: the tail of its stderr for error messages.
//!
//! Not here: how each kind of child is started and stopped (`kernel/process.rs`,
//! `tools/client.rs`).

/// The last 15 lines of a child's output, for error messages.
pub(crate) fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.trim_end().lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}
