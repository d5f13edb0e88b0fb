//! `${VAR}` substitution in MCP server params.
//!
//! Syntax (applied to every JSON *string value*, recursively; object keys are left alone):
//! - `${NAME}` is replaced by the value of `NAME` from the environment map passed in
//!   (the process environment, possibly extended by a `.env` file; the caller decides).
//!   `NAME` is `[A-Za-z_][A-Za-z0-9_]*`. A variable that is not in the map is an error naming it.
//! - `$${` is an escape: it produces a literal `${` and starts no placeholder.
//! - A `$` not followed by `{` is kept as is (`$HOME`, `cost: $5` are not placeholders).
//! - `${` without a closing `}` or with an invalid name is an error (never silently kept).
//!
//! Substitution happens at connect time; params are stored and logged as written. The values
//! that substitution produced are collected so that callers can scrub them from error text.
//!
//! This module does not read the environment or `.env` files itself.

use std::collections::HashMap;

use serde_json::Value;

use super::ToolsError;

/// Substitutes `${VAR}` placeholders in all string values of `value`.
pub fn substitute(value: &Value, env: &HashMap<String, String>) -> Result<Value, ToolsError> {
    let mut secrets = Vec::new();
    substitute_value(value, env, "", &mut secrets)
}

fn join(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_string()
    } else {
        format!("{at}.{key}")
    }
}

fn substitute_value(
    value: &Value,
    env: &HashMap<String, String>,
    at: &str,
    secrets: &mut Vec<String>,
) -> Result<Value, ToolsError> {
    Ok(match value {
        Value::String(s) => Value::String(substitute_str(s, env, at, secrets)?),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, v)| substitute_value(v, env, &format!("{at}[{i}]"), secrets))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| Ok((k.clone(), substitute_value(v, env, &join(at, k), secrets)?)))
                .collect::<Result<_, ToolsError>>()?,
        ),
        other => other.clone(),
    })
}

/// Substitutes placeholders in one string. `at` names the location for error messages;
/// expanded values are appended to `secrets`.
pub(crate) fn substitute_str(
    s: &str,
    env: &HashMap<String, String>,
    at: &str,
    secrets: &mut Vec<String>,
) -> Result<String, ToolsError> {
    let at = if at.is_empty() { "<root>" } else { at };
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let tail = &rest[pos..];
        if let Some(after) = tail.strip_prefix("$${") {
            out.push_str("${");
            rest = after;
        } else if let Some(after) = tail.strip_prefix("${") {
            let Some(end) = after.find('}') else {
                return Err(ToolsError::InvalidPlaceholder {
                    at: at.to_string(),
                    problem: "`${` has no closing `}`".to_string(),
                });
            };
            let name = &after[..end];
            if !is_valid_name(name) {
                return Err(ToolsError::InvalidPlaceholder {
                    at: at.to_string(),
                    problem: format!("`{name}` is not a valid variable name"),
                });
            }
            let Some(val) = env.get(name) else {
                return Err(ToolsError::MissingVariable {
                    name: name.to_string(),
                    at: at.to_string(),
                });
            };
            out.push_str(val);
            crate::redact::register(name, val);
            secrets.push(val.clone());
            rest = &after[end + 1..];
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// True when `s` contains a `${` placeholder (escaped `$${` does not count).
pub(crate) fn has_placeholder(s: &str) -> bool {
    let mut rest = s;
    while let Some(pos) = rest.find('$') {
        let tail = &rest[pos..];
        if let Some(after) = tail.strip_prefix("$${") {
            rest = after;
        } else if tail.starts_with("${") {
            return true;
        } else {
            rest = &tail[1..];
        }
    }
    false
}

fn is_valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Replaces every secret (a value produced by substitution) in `text` with `***`.
///
/// Values shorter than 4 characters are not redacted: they would mangle unrelated text and
/// are not credible secrets.
#[derive(Clone, Default)]
pub(crate) struct Redactor {
    secrets: Vec<String>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} values)", self.secrets.len())
    }
}

impl Redactor {
    pub(crate) fn new(mut secrets: Vec<String>) -> Self {
        secrets.retain(|s| s.chars().count() >= 4);
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Self { secrets }
    }

    pub(crate) fn redact(&self, text: &str) -> String {
        let mut out = text.to_string();
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), "***");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn env() -> HashMap<String, String> {
        HashMap::from([
            ("TOKEN".to_string(), "s3cr3t-value".to_string()),
            ("_X1".to_string(), "x".to_string()),
        ])
    }

    #[test]
    fn substitutes_recursively_in_strings_only() {
        let v = json!({"a": "Bearer ${TOKEN}", "b": ["${_X1}${_X1}", 3, {"c": "${TOKEN}"}], "${TOKEN}": true});
        let mut secrets = Vec::new();
        let out = substitute_value(&v, &env(), "", &mut secrets).unwrap();
        assert_eq!(
            out,
            json!({"a": "Bearer s3cr3t-value", "b": ["xx", 3, {"c": "s3cr3t-value"}], "${TOKEN}": true})
        );
        assert_eq!(secrets.len(), 4);
    }

    #[test]
    fn escapes_and_plain_dollars() {
        let mut s = Vec::new();
        assert_eq!(
            substitute_str("$${TOKEN} $HOME $5 $", &env(), "x", &mut s).unwrap(),
            "${TOKEN} $HOME $5 $"
        );
        assert!(s.is_empty());
        assert!(!has_placeholder("$${A}"));
        assert!(has_placeholder("a${A}"));
    }

    #[test]
    fn errors_name_the_variable_and_location() {
        let err = substitute(&json!({"headers": {"Auth": "${NOPE}"}}), &env()).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("`NOPE`"), "{msg}");
        assert!(msg.contains("headers.Auth"), "{msg}");
        let err = substitute(&json!(["${BAD-NAME}"]), &env()).unwrap_err();
        assert!(
            err.to_string().contains("`BAD-NAME` is not a valid"),
            "{err}"
        );
        let err = substitute(&json!("${OPEN"), &env()).unwrap_err();
        assert!(err.to_string().contains("no closing"), "{err}");
    }

    #[test]
    fn redactor_scrubs_long_values() {
        let r = Redactor::new(vec!["s3cr3t-value".into(), "x".into()]);
        assert_eq!(r.redact("got s3cr3t-value and x"), "got *** and x");
    }
}
