//! The session notebooks as MCP resources: `ipybox://notebook/<session tag>` is the notebook
//! of one kernel session (what it ran, printed and was approved, see `ipybox::notebook`),
//! listed by `resources/list` and read by `resources/read` — in both MCP eras, for the
//! session's owner only. Another credential's session, a closed one and a tag nobody has answer
//! alike: unknown. The content is the current file, read back through the descriptor that
//! wrote it and checked against a digest of what was written (never through its name: under
//! `--sandbox` the workspace is the kernel's to change).
//!
//! Not here: recording (the executor), which sessions a caller owns (the [`super::Scope`]).

use rmcp::ErrorData;
use rmcp::model::{ReadResourceResult, Resource, ResourceContents};
use serde_json::json;

use super::session::KernelSession;

/// The answer for the notebook of one of the caller's sessions that is no longer written.
pub(crate) fn not_recorded(uri: &str, why: &str) -> ErrorData {
    ErrorData::resource_not_found(format!("{uri}: {why}"), Some(json!({"uri": uri})))
}

/// The URI prefix of session notebooks.
pub(crate) const PREFIX: &str = "ipybox://notebook/";

/// The MIME type of a notebook.
const MIME: &str = "application/x-ipynb+json";

/// The resource of `session`'s notebook, if it records one.
pub(crate) fn resource(session: &KernelSession) -> Option<Resource> {
    let notebook = session.executor.notebook()?;
    let mut resource = Resource::new(
        format!("{PREFIX}{}", notebook.tag()),
        format!("notebook-{}", notebook.tag()),
    )
    .with_title(format!("Notebook of ipybox session {}", notebook.tag()))
    .with_description(
        "Every cell this kernel session ran, with its outputs and the tool calls approved or declined (Jupyter notebook, nbformat 4.5)",
    );
    resource.mime_type = Some(MIME.into());
    Some(resource)
}

/// The tag a notebook URI names, if it is one.
pub(crate) fn tag(uri: &str) -> Option<&str> {
    uri.strip_prefix(PREFIX).filter(|t| !t.is_empty())
}

/// Whether `session`'s notebook is the one tagged `tag`.
pub(crate) fn is(session: &KernelSession, tag: &str) -> bool {
    session
        .executor
        .notebook()
        .is_some_and(|notebook| notebook.tag() == tag)
}

/// The content of `session`'s notebook, read as `uri` (`None`: it records none): the current
/// file, read back from disk off the runtime's workers (see `ipybox::notebook::Notebook::read`).
pub(crate) async fn read(
    session: &KernelSession,
    uri: &str,
) -> Option<Result<ReadResourceResult, ErrorData>> {
    let notebook = session.executor.notebook()?.clone();
    let read = tokio::task::spawn_blocking(move || notebook.read())
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r);
    Some(match read {
        Ok(bytes) => Ok(ReadResourceResult::new(vec![
            ResourceContents::TextResourceContents {
                uri: uri.to_string(),
                mime_type: Some(MIME.into()),
                text: String::from_utf8(bytes)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
                meta: None,
            },
        ])),
        Err(e) => Err(ErrorData::internal_error(
            format!("{uri}: cannot read the session notebook: {e}"),
            Some(json!({"uri": uri})),
        )),
    })
}

/// The answer for a notebook URI that names no session of the caller's (the same whether it
/// exists for someone else or not at all).
pub(crate) fn unknown(uri: &str) -> ErrorData {
    ErrorData::resource_not_found(
        format!(
            "no notebook {uri} among your sessions: a session's notebook is readable by its owner while the session is open\n  help: list yours with resources/list"
        ),
        Some(json!({"uri": uri})),
    )
}
