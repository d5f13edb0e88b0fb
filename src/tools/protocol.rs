//! The wire protocol between generated code in the kernel (`python/ipybox_runtime`, stdlib-only
//! Python) and the tool server ([`super::server`]): JSON bodies over HTTP/1.1 on a Unix socket.
//!
//! - `POST /run` [`RunRequest`] -> [`RunReply`]: a result, or an error whose [`ErrorKind`]
//!   selects the exception the kernel raises (`ToolError`, `ApprovalRejectedError`,
//!   `ApprovalTimeout`, the base `ToolRunnerError` for a malformed request);
//! - `POST /approve` [`ApproveRequest`] -> [`RunReply`]: approval of a shell command
//!   (`approve_shell_cmds`); `Done` (empty) means run it, errors are the same kinds as `/run`'s;
//! - `PUT /reset` -> [`ResetReply`] (closes all MCP sessions);
//! - `GET /status` -> [`StatusReply`].
//!
//! Both sides are checked against each other by round-trip tests (below) that run the Python
//! runtime on replies serialized here and parse the requests it builds, also over a Unix socket
//! through both of its call paths (`ToolRunner.run` and `ToolRunner.run_async`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `POST /run`: call `tool_name` of the server with these params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct RunRequest {
    pub(crate) server_name: String,
    /// As written at registration (`${VAR}` unresolved). Never used: every call uses the params
    /// the host recorded; compared with those only to tell two registrations of one name apart
    /// (`super::registry`).
    pub(crate) server_params: Value,
    pub(crate) tool_name: String,
    #[serde(default)]
    pub(crate) arguments: Map<String, Value>,
}

/// `POST /approve`: may this shell command run? The server name is always `ipybox`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ApproveRequest {
    /// `shell` (line commands) or `shell_magic` (cell magics).
    pub(crate) tool_name: String,
    /// `{"cmd": <the command after variable expansion, or the magic's cell>}`, plus `magic`
    /// (e.g. `"%%bash"`) for cell magics.
    pub(crate) arguments: Map<String, Value>,
}

/// The answer to `POST /run` (and the error body of any failed request).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum RunReply {
    Failed {
        error: WireError,
    },
    Done {
        /// The tool's structured content, if it returned any; the kernel then returns this.
        structured: Option<Value>,
        /// The tool's text content, returned when there is no structured content.
        text: String,
    },
}

impl RunReply {
    pub(crate) fn error(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self::Failed {
            error: WireError {
                kind,
                message: message.into(),
            },
        }
    }
}

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct WireError {
    pub(crate) kind: ErrorKind,
    pub(crate) message: String,
}

/// The failure classes the kernel tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ErrorKind {
    /// The MCP server reported an error, or could not be reached -> `ToolError`.
    ToolError,
    /// The application rejected the call -> `ApprovalRejectedError`.
    Rejected,
    /// No decision within the approval timeout; the call was not made -> `ApprovalTimeout`.
    ApprovalTimeout,
    /// The request itself was malformed -> `ToolRunnerError`.
    BadRequest,
}

/// `PUT /reset`: how many MCP sessions were closed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ResetReply {
    pub(crate) closed: usize,
}

/// `GET /status`: how many MCP sessions are open.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StatusReply {
    pub(crate) sessions: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Runs `script` with `python3` and the repository's `python/` on `sys.path`; returns stdout.
    fn python(script: &str, stdin: &str) -> String {
        python_with(script, stdin, &[])
    }

    /// [`python`] with extra environment variables.
    fn python_with(script: &str, stdin: &str, env: &[(&str, &str)]) -> String {
        use std::io::Write;
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/python");
        let mut child = crate::child_process::host_command_blocking("python3")
            .args(["-c", script])
            .env("PYTHONPATH", dir)
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs (a prerequisite of ipybox's tests)");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "python failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn sample_replies() -> [RunReply; 6] {
        [
            RunReply::Done {
                structured: Some(json!({"result": 5})),
                text: "5".into(),
            },
            RunReply::Done {
                structured: None,
                text: "Hello".into(),
            },
            RunReply::error(ErrorKind::ToolError, "fx.fail failed: it broke"),
            RunReply::error(ErrorKind::Rejected, "rejected by the application"),
            RunReply::error(ErrorKind::ApprovalTimeout, "not approved within 1 s"),
            RunReply::error(ErrorKind::BadRequest, "invalid /run request"),
        ]
    }

    /// What the runtime makes of [`sample_replies`], in order.
    const SAMPLE_OUTCOMES: [&str; 6] = [
        "value {\"result\": 5}",
        "value \"Hello\"",
        "ToolError fx.fail failed: it broke",
        "ApprovalRejectedError rejected by the application",
        "ApprovalTimeoutError not approved within 1 s",
        "ToolRunnerError invalid /run request",
    ];

    #[test]
    fn replies_round_trip_through_the_python_runtime() {
        let replies = sample_replies();
        let lines: Vec<String> = replies
            .iter()
            .map(|r| serde_json::to_string(r).unwrap())
            .collect();
        // Each reply parses back into the same value on this side...
        for (line, reply) in lines.iter().zip(&replies) {
            assert_eq!(&serde_json::from_str::<RunReply>(line).unwrap(), reply);
        }
        // ...and the runtime turns it into the promised value or exception.
        let script = r#"
import json, sys
import ipybox_runtime as rt
for line in sys.stdin:
    try:
        print("value", json.dumps(rt._result(json.loads(line))))
    except rt.ToolRunnerError as e:
        print(type(e).__name__, e)
"#;
        let out = python(script, &(lines.join("\n") + "\n"));
        assert_eq!(out, SAMPLE_OUTCOMES.join("\n") + "\n");
    }

    /// Both call paths of the runtime against hyper serving the replies as the tool server does
    /// (`server::json_response`, 400 for a bad request): the same requests arrive, the same
    /// values and exceptions come back; the sync path keeps one connection alive, the async
    /// path opens one per call and reads the reply to the server's close.
    #[tokio::test(flavor = "multi_thread")]
    async fn both_call_paths_round_trip_over_the_socket() {
        use super::super::server::json_response;
        use hyper::StatusCode;
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};

        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("tools.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let expected = RunRequest {
            server_name: "fx".into(),
            server_params: json!({"command": "python3"}),
            tool_name: "add".into(),
            arguments: json!({"a": 2}).as_object().unwrap().clone(),
        };
        let served = Arc::new(AtomicUsize::new(0));
        let connections = Arc::new(AtomicUsize::new(0));
        let server = {
            let (served, connections) = (served.clone(), connections.clone());
            tokio::spawn(async move {
                loop {
                    let (stream, _) = listener.accept().await.unwrap();
                    connections.fetch_add(1, Ordering::SeqCst);
                    let (served, expected) = (served.clone(), expected.clone());
                    let service = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            let (served, expected) = (served.clone(), expected.clone());
                            async move {
                                use http_body_util::BodyExt;
                                let body = req.into_body().collect().await.unwrap().to_bytes();
                                let request: RunRequest = serde_json::from_slice(&body).unwrap();
                                assert_eq!(request, expected);
                                // Each reply twice: once per call path.
                                let reply = sample_replies()
                                    [served.fetch_add(1, Ordering::SeqCst) / 2]
                                    .clone();
                                let status = match &reply {
                                    RunReply::Failed { error }
                                        if error.kind == ErrorKind::BadRequest =>
                                    {
                                        StatusCode::BAD_REQUEST
                                    }
                                    _ => StatusCode::OK,
                                };
                                json_response(status, &reply)
                            }
                        },
                    );
                    tokio::spawn(
                        hyper::server::conn::http1::Builder::new()
                            .keep_alive(true)
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
                    );
                }
            })
        };
        let script = r#"
import asyncio, json
import ipybox_runtime as rt
runner = rt.ToolRunner("fx", {"command": "python3"})
async def outcome(call):
    try:
        value = call()
        if asyncio.iscoroutine(value):
            value = await value
        return "value " + json.dumps(value)
    except rt.ToolRunnerError as e:
        return f"{type(e).__name__} {e}"
async def main():
    for _ in range(6):
        print("sync", await outcome(lambda: runner.run("add", {"a": 2})))
        print("async", await outcome(lambda: runner.run_async("add", {"a": 2})))
asyncio.run(main())
"#;
        let path = socket.to_string_lossy().into_owned();
        let out = tokio::task::spawn_blocking(move || {
            python_with(script, "", &[("IPYBOX_TOOL_SOCKET", path.as_str())])
        })
        .await
        .unwrap();
        server.abort();
        let expected: String = SAMPLE_OUTCOMES
            .iter()
            .map(|o| format!("sync {o}\nasync {o}\n"))
            .collect();
        assert_eq!(out, expected);
        assert_eq!(served.load(Ordering::SeqCst), 12);
        assert_eq!(connections.load(Ordering::SeqCst), 1 + 6);
    }

    #[test]
    fn the_runtime_builds_requests_the_server_reads() {
        let script = r#"
import json
import ipybox_runtime as rt
runner = rt.ToolRunner("fx", {"command": "python3", "env": {"KEY": "${KEY}"}})
print(json.dumps(runner._request_body("add", {"a": 2, "b": [3]})))
"#;
        let out = python(script, "");
        let request: RunRequest = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(
            request,
            RunRequest {
                server_name: "fx".into(),
                server_params: json!({"command": "python3", "env": {"KEY": "${KEY}"}}),
                tool_name: "add".into(),
                arguments: json!({"a": 2, "b": [3]}).as_object().unwrap().clone(),
            }
        );
    }

    #[test]
    fn the_runtime_knows_every_error_kind() {
        // A kind the runtime does not map would surface as the base class: list them all.
        let kinds = [
            (ErrorKind::ToolError, "ToolError"),
            (ErrorKind::Rejected, "ApprovalRejectedError"),
            (ErrorKind::ApprovalTimeout, "ApprovalTimeoutError"),
            (ErrorKind::BadRequest, "ToolRunnerError"),
        ];
        let script = r#"
import ipybox_runtime as rt
for kind, cls in sorted(rt._ERRORS.items()):
    print(kind, cls.__name__)
"#;
        let mut expected: Vec<String> = kinds
            .iter()
            .map(|(k, cls)| {
                let wire = serde_json::to_value(k).unwrap();
                format!("{} {cls}", wire.as_str().unwrap())
            })
            .collect();
        expected.sort();
        assert_eq!(python(script, ""), expected.join("\n") + "\n");
    }
}
