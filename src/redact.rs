//! The values ipybox knows to be secret, and their redaction in what it writes down: session
//! notebooks (outputs, sources, metadata), the MCP notebook resource (served from the
//! notebook) and ipybox's log lines. Each occurrence of a secret becomes `[redacted: NAME]`, as CI
//! systems mask secrets in their logs. The result a cell returns to its caller is not redacted
//! (the Python ipybox returns a cell's output as it is).
//!
//! The secrets (registered by whoever learns them, process-wide):
//! - every value of the workspace `.env` (the command line reads it),
//! - the values `${VAR}` placeholders of registered MCP servers resolve to
//!   ([`crate::tools::env_subst`]),
//! - `KERNEL_ENV_*` values whose name ends in `_KEY`, `_TOKEN`, `_SECRET`, `_PASSWORD` or
//!   `_CREDENTIALS` ([`is_secret_name`]: the names such values already have, no list to keep),
//! - ipybox's own bearer tokens and session key.
//!
//! Values shorter than [`MIN_SECRET_CHARS`] are not redacted: "1", "true" or "dev" would mask
//! ordinary output everywhere.

use std::borrow::Cow;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::Value;

/// The shortest value redacted (characters).
pub const MIN_SECRET_CHARS: usize = 8;

/// `(name, value)`, longest value first (a secret that contains another is replaced whole).
static SECRETS: RwLock<Vec<(String, String)>> = RwLock::new(Vec::new());
/// Whether any secret is known (the common case, none, costs one atomic load).
static ANY: AtomicBool = AtomicBool::new(false);

/// Whether a variable named `name` holds a secret by its name (for `KERNEL_ENV_*`, whose values
/// are otherwise configuration the kernel reads).
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    ["_KEY", "_TOKEN", "_SECRET", "_PASSWORD", "_CREDENTIALS"]
        .iter()
        .any(|suffix| upper.ends_with(suffix))
}

/// Registers `value` as the secret `name` (ignored when shorter than [`MIN_SECRET_CHARS`] or
/// known already).
pub fn register(name: &str, value: &str) {
    if value.chars().count() < MIN_SECRET_CHARS {
        return;
    }
    {
        let known = SECRETS.read().unwrap_or_else(|p| p.into_inner());
        if known.iter().any(|(_, v)| v == value) {
            return;
        }
    }
    let mut known = SECRETS.write().unwrap_or_else(|p| p.into_inner());
    if known.iter().any(|(_, v)| v == value) {
        return;
    }
    known.push((name.to_string(), value.to_string()));
    known.sort_by_key(|s| std::cmp::Reverse(s.1.len()));
    ANY.store(true, Ordering::Release);
}

/// `text` with every known secret replaced by `[redacted: NAME]`.
pub fn redact(text: &str) -> Cow<'_, str> {
    if !ANY.load(Ordering::Acquire) {
        return Cow::Borrowed(text);
    }
    let known = SECRETS.read().unwrap_or_else(|p| p.into_inner());
    let mut out: Option<String> = None;
    for (name, value) in known.iter() {
        let current = out.as_deref().unwrap_or(text);
        if current.contains(value.as_str()) {
            out = Some(current.replace(value.as_str(), &format!("[redacted: {name}]")));
        }
    }
    out.map_or(Cow::Borrowed(text), Cow::Owned)
}

/// Redacts every string (and object key) in `value`.
pub fn redact_json(value: &mut Value) {
    if !ANY.load(Ordering::Acquire) {
        return;
    }
    match value {
        Value::String(s) => {
            if let Cow::Owned(r) = redact(s) {
                *s = r;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_json),
        Value::Object(map) => {
            let redacted_keys = map.keys().any(|k| matches!(redact(k), Cow::Owned(_)));
            if redacted_keys {
                let old = std::mem::take(map);
                for (k, mut v) in old {
                    redact_json(&mut v);
                    map.insert(redact(&k).into_owned(), v);
                }
            } else {
                map.values_mut().for_each(redact_json);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_replaced_by_name_longest_first_and_short_ones_are_not() {
        register("REDACT_TEST_SHORT", "abc1234");
        register("REDACT_TEST_A", "sk-redact-test-0123456789");
        register("REDACT_TEST_B", "sk-redact-test-0123456789-and-more");
        assert_eq!(
            redact("a sk-redact-test-0123456789 b sk-redact-test-0123456789-and-more abc1234"),
            "a [redacted: REDACT_TEST_A] b [redacted: REDACT_TEST_B] abc1234"
        );
        let mut v =
            serde_json::json!({"x": ["sk-redact-test-0123456789"], "sk-redact-test-0123456789": 1});
        redact_json(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"x": ["[redacted: REDACT_TEST_A]"], "[redacted: REDACT_TEST_A]": 1})
        );
        assert!(matches!(redact("nothing here"), Cow::Borrowed(_)));
    }

    #[test]
    fn secret_names_by_suffix() {
        assert!(is_secret_name("OPENAI_API_KEY"));
        assert!(is_secret_name("github_token"));
        assert!(!is_secret_name("LANG"));
        assert!(!is_secret_name("KEYBOARD"));
    }
}
