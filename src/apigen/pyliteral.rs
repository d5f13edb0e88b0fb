//! Rendering JSON values as Python source: string literals, value literals and docstrings.
//!
//! This is the only place where text from a schema becomes Python source. Everything is escaped
//! so that the result is inert data (a literal or a docstring), never code. It does not decide
//! *what* to emit; see `render.rs` for that.

use serde_json::Value;
use std::fmt::Write;

/// Escapes one character for use inside a double-quoted Python string (or a docstring).
/// Returns `None` when the character can be written as is.
fn escape_char(c: char, in_docstring: bool) -> Option<String> {
    match c {
        '\\' => Some("\\\\".into()),
        '"' if !in_docstring => Some("\\\"".into()),
        '\n' if !in_docstring => Some("\\n".into()),
        '\n' => None,
        '\r' => Some("\\r".into()),
        '\t' if !in_docstring => Some("\\t".into()),
        '\t' => None,
        c if (c as u32) < 0x20 || c == '\u{7f}' => Some(format!("\\x{:02x}", c as u32)),
        // Line/paragraph separators, NEL and other invisible format characters: escaped so the
        // source stays readable and no editor or tokenizer treats them as line breaks.
        '\u{80}'..='\u{9f}'
        | '\u{2028}'
        | '\u{2029}'
        | '\u{200b}'..='\u{200f}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2066}'..='\u{2069}'
        | '\u{feff}' => Some(format!("\\u{:04x}", c as u32)),
        _ => None,
    }
}

/// A double-quoted Python string literal for `s`, safe for any input.
pub fn py_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match escape_char(c, false) {
            Some(e) => out.push_str(&e),
            None => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A Python literal for a JSON value (`null`/`true`/`false` become `None`/`True`/`False`).
/// Single line; see `py_literal_pretty` for a multi-line form.
pub fn py_literal(v: &Value) -> String {
    let mut out = String::new();
    write_literal(&mut out, v, None, 0);
    out
}

/// Like [`py_literal`], but non-empty containers are spread over lines, indented by 4 spaces per
/// level starting at `indent`.
pub(super) fn py_literal_pretty(v: &Value, indent: usize) -> String {
    let mut out = String::new();
    write_literal(&mut out, v, Some(4), indent);
    out
}

fn py_number(n: &serde_json::Number) -> String {
    if let Some(i) = n.as_i64() {
        i.to_string()
    } else if let Some(u) = n.as_u64() {
        u.to_string()
    } else {
        let f = n.as_f64().unwrap_or(0.0);
        if f.is_finite() {
            // Debug keeps a `.0` or an exponent, so the value stays a float in Python.
            format!("{f:?}")
        } else {
            "None".into()
        }
    }
}

fn write_literal(out: &mut String, v: &Value, step: Option<usize>, indent: usize) {
    match v {
        Value::Null => out.push_str("None"),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::Number(n) => out.push_str(&py_number(n)),
        Value::String(s) => out.push_str(&py_str(s)),
        Value::Array(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            write_items(out, items.iter().map(|x| (None, x)), step, indent);
            out.push(']');
        }
        Value::Object(map) => {
            if map.is_empty() {
                out.push_str("{}");
                return;
            }
            out.push('{');
            write_items(
                out,
                map.iter().map(|(k, x)| (Some(k.as_str()), x)),
                step,
                indent,
            );
            out.push('}');
        }
    }
}

fn write_items<'a>(
    out: &mut String,
    items: impl Iterator<Item = (Option<&'a str>, &'a Value)>,
    step: Option<usize>,
    indent: usize,
) {
    let inner = indent + step.unwrap_or(0);
    for (i, (key, value)) in items.enumerate() {
        match step {
            Some(_) => {
                out.push('\n');
                out.extend(std::iter::repeat_n(' ', inner));
            }
            None if i > 0 => out.push_str(", "),
            None => {}
        }
        if let Some(k) = key {
            out.push_str(&py_str(k));
            out.push_str(": ");
        }
        write_literal(out, value, step, inner);
        if step.is_some() {
            out.push(',');
        }
    }
    if step.is_some() {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', indent));
    }
}

/// The body of a `"""` docstring for `text`: backslashes and quotes that could end the string
/// are escaped, control characters are written as escapes, continuation lines are indented by
/// `indent` spaces and trailing whitespace is trimmed. Returns the text between the quotes.
pub(super) fn docstring_body(text: &str, indent: usize) -> String {
    let pad: String = " ".repeat(indent);
    let mut raw = String::with_capacity(text.len() + 8);
    let limit = DOC_WIDTH.saturating_sub(indent).max(40);
    let mut first = true;
    for long_line in text.trim().split('\n') {
        for line in wrap_line(long_line.trim_end(), limit) {
            if !first {
                raw.push('\n');
                if !line.is_empty() {
                    raw.push_str(&pad);
                }
            }
            first = false;
            raw.push_str(&line);
        }
    }
    let mut out = String::with_capacity(raw.len() + 8);
    let mut quotes = 0usize; // unescaped quotes just emitted
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '"' {
            // No run of three quotes, and no quote touching the closing `"""`.
            if quotes == 2 || chars.peek().is_none() {
                out.push_str("\\\"");
                quotes = 0;
            } else {
                out.push('"');
                quotes += 1;
            }
            continue;
        }
        quotes = 0;
        match escape_char(c, true) {
            Some(e) => out.push_str(&e),
            None => out.push(c),
        }
    }
    out
}

/// Docstring lines are wrapped at spaces to stay within this many columns.
const DOC_WIDTH: usize = 96;

/// Splits an over-long line at spaces; continuation lines keep the line's leading whitespace.
fn wrap_line(line: &str, limit: usize) -> Vec<String> {
    if line.chars().count() <= limit {
        return vec![line.to_string()];
    }
    let lead: String = line.chars().take_while(|c| *c == ' ').collect();
    let mut out = Vec::new();
    let mut cur = lead.clone();
    for word in line[lead.len()..].split(' ') {
        if cur.len() > lead.len() && cur.chars().count() + 1 + word.chars().count() > limit {
            out.push(std::mem::replace(&mut cur, lead.clone()));
        }
        if cur.len() > lead.len() {
            cur.push(' ');
        }
        cur.push_str(word);
    }
    out.push(cur);
    out
}

/// A complete docstring (with quotes) for `text`, with continuation lines indented by `indent`.
/// Multi-line docstrings put the closing quotes on their own line.
pub(super) fn docstring(text: &str, indent: usize) -> String {
    let body = docstring_body(text, indent);
    if body.contains('\n') {
        format!("\"\"\"{body}\n{}\"\"\"", " ".repeat(indent))
    } else {
        format!("\"\"\"{body}\"\"\"")
    }
}

/// A string expression for `s` that fits in about `width` columns when placed at `indent`:
/// a single literal if short enough, else a parenthesised implicit concatenation of literals
/// split after spaces and newlines.
pub(super) fn py_str_wrapped(s: &str, indent: usize, width: usize) -> String {
    let single = py_str(s);
    if indent + single.len() <= width && !s.contains('\n') {
        return single;
    }
    let avail = width.saturating_sub(indent + 7).max(40);
    let mut pieces: Vec<String> = Vec::new();
    let mut cur = String::new();
    let mut cur_len = 0usize;
    // Split into words that keep their trailing separator.
    let mut word = String::new();
    let mut words: Vec<String> = Vec::new();
    for c in s.chars() {
        word.push(c);
        if c == ' ' || c == '\n' {
            words.push(std::mem::take(&mut word));
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    for w in words {
        let wl = py_str(&w).len() - 2;
        if cur_len > 0 && cur_len + wl > avail {
            pieces.push(std::mem::take(&mut cur));
            cur_len = 0;
        }
        cur_len += wl;
        let ends_line = w.ends_with('\n');
        cur.push_str(&w);
        if ends_line {
            pieces.push(std::mem::take(&mut cur));
            cur_len = 0;
        }
    }
    if !cur.is_empty() {
        pieces.push(cur);
    }
    if pieces.len() <= 1 {
        return single;
    }
    let pad = " ".repeat(indent + 4);
    let mut out = String::from("(\n");
    for p in &pieces {
        let _ = writeln!(out, "{pad}{}", py_str(p));
    }
    out.push_str(&" ".repeat(indent));
    out.push(')');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strings_are_escaped() {
        assert_eq!(py_str("a\"b\\c\nd\t\u{0}"), r#""a\"b\\c\nd\t\x00""#);
        assert_eq!(py_str("x\u{2028}y"), r#""x\u2028y""#);
        assert_eq!(py_str("é"), "\"é\"");
    }

    #[test]
    fn literals() {
        let v = json!({"a": [1, 2.5, 1.0, true, false, null], "b": {"c": "d"}, "e": []});
        assert_eq!(
            py_literal(&v),
            r#"{"a": [1, 2.5, 1.0, True, False, None], "b": {"c": "d"}, "e": []}"#
        );
        assert_eq!(
            py_literal_pretty(&json!({"a": [1], "b": {}}), 0),
            "{\n    \"a\": [\n        1,\n    ],\n    \"b\": {},\n}"
        );
    }

    #[test]
    fn docstrings_cannot_be_closed() {
        assert_eq!(docstring(r#"a """ b \ c"#, 4), r#""""a ""\" b \\ c""""#);
        assert_eq!(docstring("ends with \"", 0), r#""""ends with \"""""#);
        assert_eq!(docstring_body("\"\"\"\"\"\"", 0), "\"\"\\\"\"\"\\\"");
        assert_eq!(
            docstring("l1\nl2  \n\nl3", 4),
            "\"\"\"l1\n    l2\n\n    l3\n    \"\"\""
        );
    }

    #[test]
    fn wrapping() {
        let s = "word ".repeat(30);
        let w = py_str_wrapped(s.trim(), 8, 80);
        assert!(w.starts_with("(\n"));
        assert!(w.lines().all(|l| l.len() <= 80), "{w}");
        assert_eq!(py_str_wrapped("short", 4, 80), "\"short\"");
    }
}
