//! `--approve ask`: each tool call (and, with `--approve-shell`, each shell command) of executed
//! code becomes an MCP `elicitation/create` request (form mode) to the client, i.e. a question
//! to its user: accept once, accept for the rest of the session, or decline.
//!
//! The form has one optional boolean, `remember` ("allow ... for the rest of this session").
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

use ipybox::tools::{ApprovalRequest, shorten};
use rmcp::RoleServer;
use rmcp::model::{
    BooleanSchema, ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationSchema,
    PrimitiveSchemaDefinition,
};
use rmcp::service::{ElicitationMode, Peer};
use serde_json::Value;

/// The longest a single argument value is shown in the question (characters).
const MAX_VALUE_CHARS: usize = 200;
/// The longest the shown arguments (or shell command) get in total (characters).
const MAX_SHOWN_CHARS: usize = 1500;

/// What was allowed for the rest of the session: `server\0tool` for tool calls, the exact
/// command for shell commands.
#[derive(Debug, Default, Clone)]
pub(crate) struct SessionAllowances(Arc<Mutex<HashSet<String>>>);

impl SessionAllowances {
    fn key(request: &ApprovalRequest) -> String {
        match request.shell_command() {
            Some(cmd) => format!("shell\0{}\0{cmd}", request.tool_name),
            None => format!("tool\0{}\0{}", request.server_name, request.tool_name),
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

/// Decides `request` by asking the client's user (see the module docs). Returns when decided.
pub(crate) async fn decide(
    request: ApprovalRequest,
    peer: &Peer<RoleServer>,
    allowances: &SessionAllowances,
    approval_timeout: Duration,
) {
    if allowances.allows(&request) {
        return request.accept();
    }
    if !peer
        .supported_elicitation_modes()
        .contains(&ElicitationMode::Form)
    {
        tracing::warn!(
            "rejected {}: the MCP client did not declare the elicitation capability",
            request.describe()
        );
        return request.reject_with(NO_ELICITATION);
    }
    let params = elicitation(&request);
    let timeout = approval_timeout
        .checked_add(Duration::from_secs(1))
        .filter(|t| *t < Duration::from_secs(86_400 * 365));
    match peer.create_elicitation_with_timeout(params, timeout).await {
        Ok(result) => answer(request, &result, allowances),
        Err(e) => {
            tracing::warn!("asking the client about {} failed: {e}", request.describe());
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
    request: ApprovalRequest,
    result: &ElicitResult,
    allowances: &SessionAllowances,
) {
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

/// The question shown to the user: what will run, with long values shortened.
fn question(request: &ApprovalRequest) -> String {
    if let Some(cmd) = request.shell_command() {
        let kind = match request.arguments.get("magic").and_then(Value::as_str) {
            Some(magic) => format!("Run this {magic} cell"),
            None => "Run this shell command".to_string(),
        };
        return format!(
            "ipybox: {kind} from executed code?\n\n{}",
            shorten(cmd, MAX_SHOWN_CHARS)
        );
    }
    let arguments = request
        .arguments
        .iter()
        .map(|(name, value)| format!("{name}={}", shown_value(value)))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "ipybox: Allow executed code to call the tool `{}` of the MCP server `{}`?\n\nArguments: {}",
        request.tool_name,
        request.server_name,
        shorten(&arguments, MAX_SHOWN_CHARS)
    )
}

/// One argument value as JSON, strings (also nested ones) cut at [`MAX_VALUE_CHARS`].
fn shown_value(value: &Value) -> String {
    fn cut(value: &Value) -> Value {
        match value {
            Value::String(s) => Value::String(shorten(s, MAX_VALUE_CHARS)),
            Value::Array(items) => Value::Array(items.iter().map(cut).collect()),
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| (k.clone(), cut(v)))
                    .collect::<serde_json::Map<_, _>>(),
            ),
            other => other.clone(),
        }
    }
    shorten(&cut(value).to_string(), MAX_VALUE_CHARS * 2)
}

/// The form: one optional checkbox, "allow for the rest of this session".
fn form(request: &ApprovalRequest) -> ElicitationSchema {
    let what = match request.shell_command() {
        Some(_) => "this exact command".to_string(),
        None => format!("{}.{}", request.server_name, request.tool_name),
    };
    let title = format!("Allow {what} for the rest of this session");
    let remember = BooleanSchema::new()
        .title(title)
        .description("Accept runs it. Leave this unticked to be asked again next time.")
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

    #[test]
    fn shortens_long_values_and_keeps_short_ones() {
        assert_eq!(shorten("héllo", 10), "héllo");
        assert_eq!(shorten("héllo", 2), "hé…");
        let long = "x".repeat(500);
        let shown = shown_value(&serde_json::json!({"n": 3, "q": long}));
        assert_eq!(shown, format!("{{\"n\":3,\"q\":\"{}…\"}}", "x".repeat(200)));
    }
}
