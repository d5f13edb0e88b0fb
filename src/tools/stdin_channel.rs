//! The tool server's requests when they arrive over a kernel's Jupyter stdin channel instead of
//! the Unix socket (kernels on Jupyter servers, which have no route to the host).
//!
//! The kernel side (`python/ipybox_runtime/stdin_channel.py`) sends `{"method", "path", "body"}`;
//! the answer is the JSON the socket would have answered. Same requests, same code:
//!
//! - `POST /run` and `POST /approve` go to [`super::server`] (approvals included);
//! - `POST /source` (`{"module": "mcptools.github.search"}`) answers a module's source from the
//!   workspace (`host_import.py`): `{"found", "path", "package", "source"}`. Only module names
//!   made of Python identifiers, and only files inside the workspace, are served.
//!
//! The socket's limits that apply here apply the same way: a request over
//! [`server::MAX_BODY_BYTES`] is answered with an error and not parsed, and approvals go through
//! the same queue and text limits. (One request at a time travels over the channel, so there
//! is no connection limit to keep.)

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Value, json};

use super::protocol::{ApproveRequest, ErrorKind, RunReply, RunRequest};
use super::server::{self, ToolServerState};

#[derive(Deserialize)]
struct ChannelRequest {
    method: String,
    path: String,
    #[serde(default)]
    body: Value,
}

/// Answers one request (JSON text) with the JSON reply text.
pub(crate) async fn answer(state: &ToolServerState, workspace: &Path, payload: &str) -> String {
    if payload.len() > server::MAX_BODY_BYTES {
        let reply = bad(server::too_large(
            "stdin-channel",
            Some(payload.len() as u64),
        ));
        return serde_json::to_string(&reply).unwrap_or_default();
    }
    let reply = match serde_json::from_str::<ChannelRequest>(payload) {
        Err(e) => bad(format!("invalid stdin-channel request: {e}")),
        Ok(req) => match (req.method.as_str(), req.path.as_str()) {
            ("POST", "/run") => match serde_json::from_value::<RunRequest>(req.body) {
                Ok(run) => server::run_tool(state, run).await,
                Err(e) => bad(format!("invalid /run request: {e}")),
            },
            ("POST", "/approve") => match serde_json::from_value::<ApproveRequest>(req.body) {
                Ok(approve) => server::approve_shell(state, approve).await,
                Err(e) => bad(format!("invalid /approve request: {e}")),
            },
            ("POST", "/source") => match req.body.get("module").and_then(Value::as_str) {
                Some(module) => module_source(workspace, module),
                None => bad("invalid /source request: it needs a string `module`".into()),
            },
            (method, path) => bad(format!(
                "no endpoint {method} {path} on the stdin channel: use POST /run, POST /approve or POST /source"
            )),
        },
    };
    serde_json::to_string(&reply).unwrap_or_else(|e| {
        format!(
            r#"{{"error": {{"kind": "bad_request", "message": "cannot encode the reply: {e}"}}}}"#
        )
    })
}

fn bad(message: String) -> RunReply {
    RunReply::error(ErrorKind::BadRequest, message)
}

/// The source of `module` from the workspace: `a/b.py`, or the package `a/b/` (its
/// `__init__.py`, or empty for a directory without one).
fn module_source(workspace: &Path, module: &str) -> RunReply {
    let not_found = RunReply::Done {
        structured: Some(json!({"found": false})),
        text: String::new(),
    };
    let parts: Vec<&str> = module.split('.').collect();
    if !parts.iter().all(|p| is_identifier(p)) {
        return not_found;
    }
    let Ok(root) = workspace.canonicalize() else {
        return not_found;
    };
    let rel: PathBuf = parts.iter().collect();
    let candidates = [
        (rel.with_extension("py"), false),
        (rel.join("__init__.py"), true),
        (rel.clone(), true),
    ];
    for (candidate, package) in candidates {
        let full = root.join(&candidate);
        // Symlinks must not lead out of the workspace.
        let Ok(real) = full.canonicalize() else {
            continue;
        };
        if !real.starts_with(&root) {
            continue;
        }
        let source = if real.is_file() {
            match std::fs::read_to_string(&real) {
                Ok(text) => text,
                Err(e) => {
                    return RunReply::error(
                        ErrorKind::ToolError,
                        format!("cannot read {}: {e}", candidate.display()),
                    );
                }
            }
        } else if real.is_dir() && package {
            String::new()
        } else {
            continue;
        };
        return RunReply::Done {
            structured: Some(json!({
                "found": true,
                "path": candidate.to_string_lossy(),
                "package": package,
                "source": source,
            })),
            text: String::new(),
        };
    }
    not_found
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c == '_' || c.is_alphabetic())
        && chars.all(|c| c == '_' || c.is_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(reply: &RunReply) -> Value {
        match reply {
            RunReply::Done {
                structured: Some(v),
                ..
            } => v.clone(),
            other => panic!("unexpected reply {other:?}"),
        }
    }

    /// A request over the socket's body limit is answered with the same error, not parsed.
    #[tokio::test]
    async fn a_request_over_the_body_limit_is_refused() {
        let state = ToolServerState::new(
            super::super::SessionCache::new(Default::default(), std::time::Duration::from_secs(1)),
            std::time::Duration::from_secs(1),
            super::super::registry::Reach::new(
                std::sync::Arc::new(super::super::registry::Registry::in_memory()),
                Default::default(),
            ),
        );
        let dir = tempfile::tempdir().unwrap();
        let body = format!(
            r#"{{"method": "POST", "path": "/run", "body": {{"pad": "{}"}}}}"#,
            "x".repeat(server::MAX_BODY_BYTES)
        );
        let reply: Value = serde_json::from_str(&answer(&state, dir.path(), &body).await).unwrap();
        assert_eq!(reply["error"]["kind"], "bad_request");
        assert_eq!(
            reply["error"]["message"],
            format!(
                "this stdin-channel request was not read: its body is {} bytes, and the ipybox tool server takes at most 32 MiB (33554432 bytes) per request, so that kernel code cannot fill the host's memory\n  help: pass large data through a file in the workspace",
                body.len()
            )
        );
        // A small one is read (and found wanting).
        let reply = answer(
            &state,
            dir.path(),
            r#"{"method": "POST", "path": "/run", "body": {}}"#,
        )
        .await;
        assert!(reply.contains("invalid /run request"), "{reply}");
    }

    #[test]
    fn serves_workspace_modules_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path();
        std::fs::create_dir_all(ws.join("mcptools/github")).unwrap();
        std::fs::write(ws.join("mcptools/__init__.py"), "").unwrap();
        std::fs::write(ws.join("mcptools/github/search.py"), "X = 1\n").unwrap();
        std::fs::write(dir.path().join("secret.txt"), "no").unwrap();

        let v = found(&module_source(ws, "mcptools.github.search"));
        assert_eq!(v["found"], true);
        assert_eq!(v["package"], false);
        assert_eq!(v["source"], "X = 1\n");
        assert_eq!(v["path"], "mcptools/github/search.py");
        // A directory without __init__.py is a namespace package.
        let v = found(&module_source(ws, "mcptools.github"));
        assert_eq!(
            (v["found"].clone(), v["package"].clone()),
            (json!(true), json!(true))
        );
        assert_eq!(v["source"], "");
        for name in [
            "nope",
            "mcptools..x",
            "../etc",
            "mcptools/github",
            "",
            "1abc",
        ] {
            assert_eq!(found(&module_source(ws, name))["found"], false, "{name}");
        }
        #[cfg(unix)]
        {
            let outside = tempfile::tempdir().unwrap();
            std::fs::write(outside.path().join("leak.py"), "SECRET = 1").unwrap();
            std::os::unix::fs::symlink(outside.path().join("leak.py"), ws.join("leak.py")).unwrap();
            assert_eq!(found(&module_source(ws, "leak"))["found"], false);
        }
    }
}
