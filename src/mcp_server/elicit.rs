//! `--approve ask`: each tool call (and, with `--approve-shell`, each shell command) of executed
//! code becomes an MCP `elicitation/create` request (form mode) to the client, i.e. a question
//! to its user: accept once, accept for the rest of the session, or decline.
//!
//! The form has one optional boolean, `remember` ("Allow for the rest of this session").
//! Accept → the call goes ahead (with `remember`, later calls of the same tool, or the same shell
//! command, are accepted without asking until the server exits); decline or cancel → the call
//! fails in the kernel with `ApprovalRejected`, saying the user declined. No answer within the
//! approval timeout → `ApprovalTimeout` (the executor's clock; the request to the client is
//! given one second more, so the executor's timeout is what the kernel sees).
//!
//! A client that did not declare the elicitation capability cannot ask anyone: every request is
//! rejected with an error that says so (never a silent auto-accept).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipybox::tools::ApprovalRequest;
use ipybox::tools::shown::{self, Syntax};
use rmcp::RoleServer;
use rmcp::model::{
    BooleanSchema, ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationSchema,
    PrimitiveSchemaDefinition,
};
use rmcp::service::{ElicitationMode, Peer};
use serde_json::Value;

/// What was allowed for the rest of the session: a tool of one registered server (its name and
/// the fingerprint of its recorded params: a server registered again under the same name with
/// other params is asked about afresh), or one exact shell command (with the cell magic's line).
#[derive(Debug, Default, Clone)]
pub(crate) struct SessionAllowances(Arc<Mutex<HashSet<String>>>);

impl SessionAllowances {
    fn key(request: &ApprovalRequest) -> String {
        match request.shell_command() {
            Some(cmd) => {
                let magic = request
                    .arguments
                    .get("magic")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                format!("shell\0{}\0{magic}\0{cmd}", request.tool_name)
            }
            None => format!(
                "tool\0{}\0{}\0{}",
                request.server_name,
                request.server_identity().unwrap_or(""),
                request.tool_name
            ),
        }
    }

    pub(super) fn allows(&self, request: &ApprovalRequest) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&Self::key(request))
    }

    fn allow(&self, request: &ApprovalRequest) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(Self::key(request));
    }
}

/// Logs that `request` was rejected unasked (the client cannot elicit): the server and tool
/// names only, quoted and escaped (the kernel chose them); never the arguments, which can be code
/// (a shell command) or data.
pub(crate) fn log_unasked(request: &ApprovalRequest) {
    tracing::warn!(
        server = ?request.server_name,
        tool = ?request.tool_name,
        "rejected a call: the MCP client did not declare the elicitation capability"
    );
}

/// Decides `request` by asking the client's user (see the module docs). Returns when decided.
pub(crate) async fn decide(
    request: ApprovalRequest,
    peer: &Peer<RoleServer>,
    allowances: &SessionAllowances,
    approval_timeout: Duration,
) {
    if allowances.allows(&request) {
        return request.accept_remembered();
    }
    if !peer
        .supported_elicitation_modes()
        .contains(&ElicitationMode::Form)
    {
        log_unasked(&request);
        return request.reject_with(NO_ELICITATION);
    }
    let params = elicitation(&request);
    let timeout = approval_timeout
        .checked_add(Duration::from_secs(1))
        .filter(|t| *t < Duration::from_secs(86_400 * 365));
    match peer.create_elicitation_with_timeout(params, timeout).await {
        Ok(result) => answer(request, &result, allowances),
        Err(e) => {
            tracing::warn!(
                server = ?request.server_name,
                tool = ?request.tool_name,
                error = ?e.to_string(),
                "asking the client about a call failed"
            );
            request.reject_with(format!("the MCP client could not ask the user: {e}"));
        }
    }
}

/// Why a request is rejected when the client cannot ask anyone (either era).
pub(super) const NO_ELICITATION: &str = "nobody could be asked: ipybox runs with --approve ask, but this MCP client did not declare the elicitation capability (form mode)\n  help: use a client that supports elicitation (e.g. Claude Code), or start ipybox without --approve ask";

/// Applies the user's answer (an `elicitation/create` result, or an `input_required` round's
/// response) to `request`: accept (with `remember`, for the rest of the session), decline or
/// cancel.
pub(super) fn answer(
    mut request: ApprovalRequest,
    result: &ElicitResult,
    allowances: &SessionAllowances,
) {
    // What the user saw (the session notebook records it with the answer).
    let shown = question(&request);
    request.shown_as(shown);
    match result.action {
        ElicitationAction::Accept => {
            let remember = result
                .content
                .as_ref()
                .and_then(|c| c.get("remember"))
                .and_then(Value::as_bool)
                .unwrap_or(false);
            if remember {
                allowances.allow(&request);
            }
            request.accept();
        }
        ElicitationAction::Decline => request.reject_with("declined by the user"),
        ElicitationAction::Cancel => request.reject_with("cancelled by the user"),
        ref other => request.reject_with(format!("the client answered {other:?}")),
    }
}

/// The form-mode elicitation that asks about `request`.
pub(super) fn elicitation(request: &ApprovalRequest) -> ElicitRequestParams {
    ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: question(request),
        requested_schema: form(request),
    }
}

/// The question shown to the user: exactly what will run, rendered by [`shown`] (names and
/// strings quoted and escaped, a multi-line command line by line, nothing cut: the executor
/// refuses what is too long to show, see `ipybox::tools::shown::HUMAN_TEXT_LIMIT`).
fn question(request: &ApprovalRequest) -> String {
    let calls = match request.calls() {
        1 => String::new(),
        n => format!(" ({n} identical calls, one answer)"),
    };
    if let Some(cmd) = request.shell_command() {
        let kind = match request.shell_magic() {
            Some(magic) => format!("Run this {} cell", ipybox::tools::magic_line(magic)),
            None => "Run this shell command".to_string(),
        };
        return format!(
            "ipybox: {kind} from executed code{calls}?\n\n{}",
            shown::command(cmd)
        );
    }
    // The registered server's command line or URL: what the call reaches (kernels only reach
    // registered servers, with the recorded params).
    let server = request
        .server_command
        .as_deref()
        .map(|target| format!("Server: {}\n", shown::command(target)))
        .unwrap_or_default();
    format!(
        "ipybox: Allow executed code to call the tool {} of the MCP server {}{calls}?\n\n{server}Arguments: {}",
        quoted_name(&request.tool_name),
        quoted_name(&request.server_name),
        shown::arguments(&request.arguments, Syntax::Json)
    )
}

/// A server or tool name in the question: `` `name` `` when plain, else its quoted, escaped form.
fn quoted_name(name: &str) -> String {
    if shown::is_plain_name(name) {
        format!("`{name}`")
    } else {
        shown::name(name, Syntax::Json)
    }
}

/// The checkbox's title: short and the same for every request, because clients show it on one
/// line and cut it (Claude Code cut "Allow everything.echo for the rest of this sess…"); what
/// it applies to is in the description.
const REMEMBER_TITLE: &str = "Allow for the rest of this session";

/// The form: one optional checkbox, "allow for the rest of this session".
fn form(request: &ApprovalRequest) -> ElicitationSchema {
    let what = match request.shell_command() {
        Some(_) => "runs of this exact command".to_string(),
        None => format!(
            "calls of {}.{}",
            shown::name(&request.server_name, Syntax::Json),
            shown::name(&request.tool_name, Syntax::Json)
        ),
    };
    let remember = BooleanSchema::new()
        .title(REMEMBER_TITLE)
        .description(format!(
            "Ticked: later {what} run without asking until this session ends. Accept runs this one either way."
        ))
        .with_default(false);
    ElicitationSchema::new(
        [(
            "remember".to_string(),
            PrimitiveSchemaDefinition::Boolean(remember),
        )]
        .into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The question for a tool call the executor would ask about, through a real execution's
    /// request type: built by `ipybox::tools::testing`.
    #[test]
    fn questions_show_names_escaped_and_values_whole() {
        let long = "x".repeat(500);
        let cases = [
            (
                ("fx", "add", serde_json::json!({"a": 1, "b": 2})),
                "ipybox: Allow executed code to call the tool `add` of the MCP server `fx`?\n\nArguments: a=1, b=2".to_string(),
            ),
            (
                ("fx", "greet", serde_json::json!({"name": long})),
                format!("ipybox: Allow executed code to call the tool `greet` of the MCP server `fx`?\n\nArguments: name=\"{long}\""),
            ),
            (
                ("f\u{1b}[31mx", "a\u{202e}dd", serde_json::json!({"\u{200b}a": 1, "b\nipybox: fake": 2})),
                r#"ipybox: Allow executed code to call the tool "a\u202edd" of the MCP server "f\u001b[31mx"?

Arguments: "\u200ba"=1, "b\nipybox: fake"=2"#.to_string(),
            ),
        ];
        for ((server, tool, args), expected) in cases {
            let request = ipybox::tools::testing::tool_call(server, tool, args);
            assert_eq!(question(&request), expected);
        }
        let request =
            ipybox::tools::testing::shell("echo a\u{200b}\necho b\n", Some("%%script /bin/sh"));
        assert_eq!(
            question(&request),
            "ipybox: Run this %%script /bin/sh cell from executed code?\n\n| echo a\\u{200b}\n| echo b"
        );
    }
}
