//! What a tool call returns, built from what happened: a cell's output (truncated by
//! characters, its images as image content, the note on images dropped over the limits), the
//! text of a failed execution, a kernel that could not be started, a plain error result. Pure
//! functions of their inputs (a leaf of `mcp_server/`). Not here: the notes on session handles
//! and restore reports (`Announce`, in `mod.rs`), late results of parked cells (`mrtr`).

use base64::Engine;
use rmcp::model::{CallToolResult, ContentBlock};

use ipybox::executor::ExecutorError;

pub(super) fn text_error(text: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

/// Keeps the first `max` characters, appending the truncation notice.
pub(crate) fn truncate_output(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_string(),
        Some((cut, _)) => {
            format!(
                "{}\n\n[Output truncated: exceeded {max} character limit]",
                &text[..cut]
            )
        }
    }
}

/// The bytes of output a cell keeps for a request that returns `max_chars` characters: enough
/// that the first half holds them all (4 bytes a character at most), so the result is exactly
/// what it would be with everything kept. The server's `--max-output-bytes` caps it further.
pub(super) fn kept_bytes(max_chars: usize) -> usize {
    max_chars.saturating_mul(8).max(1024)
}

/// The error text when a session's kernel cannot be started.
pub(super) fn start_failed(e: &ExecutorError) -> String {
    match e {
        ExecutorError::Kernel(ipybox::kernel::KernelError::Gone { what }) => format!(
            "this session's kernel is gone: {what}\n  help: call again without `session` to start a new session (its state starts empty)"
        ),
        e => format!("the kernel could not be started: {e}"),
    }
}

/// The tool's result for a cell's result: the output (truncated to `max_chars`) and the images,
/// or the error with the output printed before it.
pub(super) async fn cell_result(
    result: Result<ipybox::executor::ExecutionResult, ExecutorError>,
    max_chars: usize,
    image_limits: (usize, usize),
) -> CallToolResult {
    let result = match result {
        Ok(result) => result,
        Err(e) => return text_error(truncate_output(&failure_text(&e), max_chars)),
    };
    let mut text = truncate_output(&result.text, max_chars);
    let mut content = Vec::new();
    if result.images_dropped > 0 {
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        text.push_str(&format!(
            "[ipybox: {} more image(s) not saved or returned: a cell keeps at most {} images and {} bytes of images (--max-images, --max-image-bytes)]",
            result.images_dropped, image_limits.0, image_limits.1
        ));
    }
    if !result.images.is_empty() {
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        text.push_str("Generated images:");
        // The bytes the kernel sent, kept in memory: the files are in the workspace, where a
        // sandboxed kernel can swap them for links.
        for (path, bytes) in result.images.iter().zip(&result.image_data) {
            text.push_str(&format!("\n- {}", path.display()));
            content.push(ContentBlock::image(
                base64::engine::general_purpose::STANDARD.encode(bytes),
                "image/png",
            ));
        }
    }
    content.insert(0, ContentBlock::text(text));
    CallToolResult::success(content)
}

/// The text of a failed execution: what was printed before, then the error.
pub(crate) fn failure_text(e: &ExecutorError) -> String {
    let output = e.output();
    let error = e.error_text();
    if output.is_empty() {
        error
    } else {
        format!("{output}\n\n{error}")
    }
}

#[cfg(test)]
mod tests {
    use super::truncate_output;

    #[test]
    fn truncates_by_characters() {
        assert_eq!(truncate_output("héllo", 10), "héllo");
        assert_eq!(truncate_output("héllo", 5), "héllo");
        assert_eq!(
            truncate_output("héllo", 2),
            "hé\n\n[Output truncated: exceeded 2 character limit]"
        );
    }
}
