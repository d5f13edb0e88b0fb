//! Naming a JSON value's kind in error messages ("found an array"). A leaf helper shared by
//! `apigen` and `tools`, which do not depend on each other.

use serde_json::Value;

/// "null", "a boolean", "a number", "a string", "an array" or "an object".
pub(crate) fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
