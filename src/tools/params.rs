//! Parsing of MCP `server_params` (the JSON object Python ipybox accepts) into [`ServerParams`].
//!
//! Accepted shapes:
//! - stdio: `{"command": str, "args": [str], "env": {str: str}, "cwd": str}` (only `command` required)
//! - HTTP: `{"url": str, "headers": {str: str}}` (only `url` required)
//!
//! An explicit `"type"` wins: `"stdio"`, `"streamable_http"` (aliases `"http"`,
//! `"streamable-http"`, `"streamableHttp"`) or `"sse"`. Without it, `command` means stdio, a URL
//! whose path ends in `/sse` means legacy SSE, and any other URL means streamable HTTP.
//!
//! Parsing validates structure only and keeps `${VAR}` placeholders as written; substitution
//! happens at connect time (`super::env_subst`). `Debug` shows env and header *names* only,
//! never their values. This module does not connect to anything.

use crate::json_kind::json_kind;
use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::ToolsError;
use super::env_subst::has_placeholder;

/// Which transport a server is reached over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportKind {
    Stdio,
    StreamableHttp,
    Sse,
}

impl TransportKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TransportKind::Stdio => "stdio",
            TransportKind::StreamableHttp => "streamable HTTP",
            TransportKind::Sse => "SSE",
        }
    }
}

/// Transport-specific part of the params, unresolved (placeholders kept).
#[derive(Clone, PartialEq)]
pub enum TransportParams {
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<String>,
    },
    Http {
        kind: TransportKind,
        url: String,
        headers: BTreeMap<String, String>,
    },
}

/// Parsed, validated, *unresolved* server params.
#[derive(Clone, PartialEq)]
pub struct ServerParams {
    pub transport: TransportParams,
    written: Value,
}

impl std::fmt::Debug for ServerParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.transport {
            TransportParams::Stdio {
                command,
                args,
                env,
                cwd,
            } => f
                .debug_struct("ServerParams::Stdio")
                .field("command", command)
                .field("args", args)
                .field("env_keys", &env.keys().collect::<Vec<_>>())
                .field("cwd", cwd)
                .finish(),
            TransportParams::Http { kind, url, headers } => f
                .debug_struct("ServerParams::Http")
                .field("kind", kind)
                .field("url", url)
                .field("header_names", &headers.keys().collect::<Vec<_>>())
                .finish(),
        }
    }
}

const STDIO_KEYS: &[&str] = &["command", "args", "env", "cwd"];
const HTTP_KEYS: &[&str] = &["url", "headers"];

fn invalid(problem: impl Into<String>, help: impl Into<String>) -> ToolsError {
    ToolsError::InvalidParams {
        problem: problem.into(),
        help: help.into(),
    }
}

fn get_string(obj: &Map<String, Value>, key: &str) -> Result<Option<String>, ToolsError> {
    match obj.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(invalid(
            format!("`{key}` must be a string, found {}", json_kind(other)),
            format!("write `\"{key}\": \"...\"`"),
        )),
    }
}

fn get_string_map(
    obj: &Map<String, Value>,
    key: &str,
) -> Result<BTreeMap<String, String>, ToolsError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                other => Err(invalid(
                    format!("`{key}.{k}` must be a string, found {}", json_kind(other)),
                    format!("quote the value: `\"{k}\": \"...\"`"),
                )),
            })
            .collect(),
        Some(other) => Err(invalid(
            format!(
                "`{key}` must be an object of strings, found {}",
                json_kind(other)
            ),
            format!("write `\"{key}\": {{\"NAME\": \"value\"}}`"),
        )),
    }
}

/// True when the URL's path ends in `/sse` (query and fragment ignored, trailing `/` allowed).
fn path_ends_in_sse(url: &str) -> bool {
    let without_query = url.split(['?', '#']).next().unwrap_or(url);
    let trimmed = without_query.trim_end_matches('/');
    // Require a path: `http://host/sse`, not a host named `sse`.
    let after_scheme = trimmed.split_once("://").map_or(trimmed, |(_, r)| r);
    after_scheme.contains('/') && trimmed.ends_with("/sse")
}

impl ServerParams {
    /// Parses and validates `server_params` as written (placeholders kept).
    pub fn parse(v: &Value) -> Result<Self, ToolsError> {
        let Value::Object(obj) = v else {
            return Err(invalid(
                format!(
                    "server params must be a JSON object, found {}",
                    json_kind(v)
                ),
                "use {\"command\": ..., \"args\": [...]} for a stdio server or {\"url\": ...} for an HTTP server",
            ));
        };
        for key in obj.keys() {
            if key != "type"
                && !STDIO_KEYS.contains(&key.as_str())
                && !HTTP_KEYS.contains(&key.as_str())
            {
                return Err(invalid(
                    format!("unknown key `{key}`"),
                    "allowed keys are `type`, `command`, `args`, `env`, `cwd` (stdio) and `url`, `headers` (HTTP)",
                ));
            }
        }
        let explicit = match obj.get("type") {
            None | Some(Value::Null) => None,
            Some(Value::String(t)) => Some(match t.as_str() {
                "stdio" => TransportKind::Stdio,
                "streamable_http" | "http" | "streamable-http" | "streamableHttp" => {
                    TransportKind::StreamableHttp
                }
                "sse" => TransportKind::Sse,
                other => {
                    return Err(invalid(
                        format!("unknown transport type `{other}`"),
                        "use `\"type\": \"stdio\"`, `\"streamable_http\"` (or `\"http\"`) or `\"sse\"`, or leave `type` out to infer it",
                    ));
                }
            }),
            Some(other) => {
                return Err(invalid(
                    format!("`type` must be a string, found {}", json_kind(other)),
                    "use `\"type\": \"stdio\"`, `\"streamable_http\"` or `\"sse\"`",
                ));
            }
        };
        let command = get_string(obj, "command")?;
        let url = get_string(obj, "url")?;
        let kind = match explicit {
            Some(k) => k,
            None => match (&command, &url) {
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        "both `command` and `url` are set",
                        "keep `command` for a stdio server or `url` for an HTTP server, or set `type`",
                    ));
                }
                (Some(_), None) => TransportKind::Stdio,
                (None, Some(u)) if path_ends_in_sse(u) => TransportKind::Sse,
                (None, Some(_)) => TransportKind::StreamableHttp,
                (None, None) => {
                    return Err(invalid(
                        "neither `command` nor `url` is set",
                        "add `\"command\": \"...\"` for a stdio server or `\"url\": \"http://...\"` for an HTTP server",
                    ));
                }
            },
        };
        let transport = match kind {
            TransportKind::Stdio => {
                if let Some(k) = HTTP_KEYS.iter().find(|k| obj.contains_key(**k)) {
                    return Err(invalid(
                        format!("`{k}` is not valid for a stdio server"),
                        "stdio servers take `command`, `args`, `env` and `cwd`",
                    ));
                }
                let Some(command) = command.filter(|c| !c.trim().is_empty()) else {
                    return Err(invalid(
                        "stdio server params need a non-empty `command`",
                        "add `\"command\": \"npx\"` (or the server's executable) and its `args`",
                    ));
                };
                let args = match obj.get("args") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(Value::Array(items)) => items
                        .iter()
                        .enumerate()
                        .map(|(i, a)| match a {
                            Value::String(s) => Ok(s.clone()),
                            other => Err(invalid(
                                format!("`args[{i}]` must be a string, found {}", json_kind(other)),
                                "quote every argument, e.g. `\"args\": [\"--port\", \"8080\"]`",
                            )),
                        })
                        .collect::<Result<_, _>>()?,
                    Some(other) => {
                        return Err(invalid(
                            format!(
                                "`args` must be an array of strings, found {}",
                                json_kind(other)
                            ),
                            "write `\"args\": [\"arg1\", \"arg2\"]`",
                        ));
                    }
                };
                TransportParams::Stdio {
                    command,
                    args,
                    env: get_string_map(obj, "env")?,
                    cwd: get_string(obj, "cwd")?,
                }
            }
            TransportKind::StreamableHttp | TransportKind::Sse => {
                if let Some(k) = STDIO_KEYS.iter().find(|k| obj.contains_key(**k)) {
                    return Err(invalid(
                        format!("`{k}` is not valid for an HTTP server"),
                        "HTTP servers take `url` and `headers`",
                    ));
                }
                let Some(url) = url else {
                    return Err(invalid(
                        format!("{} server params need a `url`", kind.as_str()),
                        "add `\"url\": \"http://host:port/mcp\"`",
                    ));
                };
                let lower = url.to_ascii_lowercase();
                if !(lower.starts_with("http://")
                    || lower.starts_with("https://")
                    || has_placeholder(&url))
                {
                    return Err(invalid(
                        format!("`url` must start with http:// or https://, found `{url}`"),
                        "write a full URL such as `http://127.0.0.1:8000/mcp`",
                    ));
                }
                let headers = get_string_map(obj, "headers")?;
                for name in headers.keys() {
                    if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                        return Err(invalid(
                            format!("`headers.{name}` is not a valid HTTP header name"),
                            "header names are ASCII tokens such as `Authorization` or `X-Api-Key`",
                        ));
                    }
                }
                TransportParams::Http { kind, url, headers }
            }
        };
        Ok(Self {
            transport,
            written: v.clone(),
        })
    }

    /// The transport this server is reached over.
    pub fn kind(&self) -> TransportKind {
        match &self.transport {
            TransportParams::Stdio { .. } => TransportKind::Stdio,
            TransportParams::Http { kind, .. } => *kind,
        }
    }

    /// What the server is, for a person deciding about a call to it: the command line of a
    /// stdio server (arguments with spaces or quotes quoted), the URL of an HTTP one.
    /// Placeholders stay as written, so no secret is shown.
    pub fn command_or_url(&self) -> String {
        match &self.transport {
            TransportParams::Stdio { command, args, .. } => std::iter::once(command)
                .chain(args)
                .map(|word| {
                    if !word.is_empty()
                        && !word
                            .chars()
                            .any(|c| c.is_whitespace() || "'\"\\".contains(c))
                    {
                        word.clone()
                    } else {
                        format!("'{}'", word.replace('\'', "'\\''"))
                    }
                })
                .collect::<Vec<_>>()
                .join(" "),
            TransportParams::Http { url, .. } => url.clone(),
        }
    }

    /// The params exactly as written (placeholders kept).
    pub fn as_written(&self) -> &Value {
        &self.written
    }

    /// A short human description as written: the command line or the URL.
    pub fn target(&self) -> String {
        match &self.transport {
            TransportParams::Stdio { command, args, .. } => {
                let mut s = format!("`{command}");
                for a in args {
                    s.push(' ');
                    s.push_str(a);
                }
                s.push('`');
                s
            }
            TransportParams::Http { url, .. } => format!("`{url}`"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn infers_transport() {
        let p = ServerParams::parse(&json!({"command": "x", "args": ["a"]})).unwrap();
        assert_eq!(p.kind(), TransportKind::Stdio);
        for (u, k) in [
            ("http://h:1/sse", TransportKind::Sse),
            ("http://h:1/sse/?x=1", TransportKind::Sse),
            ("http://h:1/mcp", TransportKind::StreamableHttp),
            ("http://sse", TransportKind::StreamableHttp),
            ("http://h/see/sse-x", TransportKind::StreamableHttp),
        ] {
            assert_eq!(
                ServerParams::parse(&json!({"url": u})).unwrap().kind(),
                k,
                "{u}"
            );
        }
        let p = ServerParams::parse(&json!({"url": "http://h/sse", "type": "http"})).unwrap();
        assert_eq!(p.kind(), TransportKind::StreamableHttp);
        let p = ServerParams::parse(&json!({"url": "http://h/mcp", "type": "sse"})).unwrap();
        assert_eq!(p.kind(), TransportKind::Sse);
    }

    #[test]
    fn debug_hides_values() {
        let p = ServerParams::parse(
            &json!({"url": "http://h/mcp", "headers": {"Authorization": "Bearer literal-token"}}),
        )
        .unwrap();
        let d = format!("{p:?}");
        assert!(
            d.contains("Authorization") && !d.contains("literal-token"),
            "{d}"
        );
    }
}
