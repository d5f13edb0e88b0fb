//! How an approval request is shown: the one renderer behind every surface that puts a request
//! in front of someone ([`super::ApprovalRequest::describe`], the MCP elicitation question, the
//! `ipybox exec` terminal prompt and the Python wheel's `ApprovalRequest.__str__`).
//!
//! Rules (see docs/approvals.md, "What a prompt shows"):
//!
//! - **nothing is cut**: every name, value and command is shown whole. What is too big to show
//!   is refused before anyone is asked ([`super::approval`] checks [`MAX_NAME_CHARS`] and the
//!   surface's text limit), never shortened;
//! - **names** (server, tool, argument and object-key names) are shown bare when they are made of
//!   ASCII letters, digits, `_`, `-` and `.` only, else as a quoted string whose every non-ASCII
//!   or invisible character is an escape (`"a\u200b"`): a name can neither hide nor look like
//!   another;
//! - **string values** are quoted (JSON, or Python's `repr` for the wheel) with control, bidi,
//!   zero-width and other invisible characters escaped (`\u202e`), newlines as `\n`;
//! - **commands** (shell commands, script-magic cells) are shown as they run, one line per line:
//!   a multi-line command has every line prefixed with `| `, so no line of it can pass for a line
//!   of the prompt; invisible characters inside are escaped as `\u{202e}`.
//!
//! Not here: which limits apply where, and refusing ([`super::approval`]).

use serde_json::{Map, Value};
use unicode_general_category::{GeneralCategory as G, get_general_category};

/// The longest a server, tool or argument name may be (characters) in a request someone is
/// asked about; longer ones are refused before anyone is asked. MCP's own tool-name rule
/// (SEP-986) allows 1 to 128 characters.
pub const MAX_NAME_CHARS: usize = 128;

/// The most characters an approval prompt for a person (the MCP client's question, the
/// terminal) shows; a request whose rendering is longer is refused before anyone is asked.
pub const HUMAN_TEXT_LIMIT: usize = 16_384;

/// How values are written: JSON (Rust, MCP, terminal) or Python literals (the wheel, whose
/// `str(request)` Python ipybox 0.9.2 wrote as `server.tool(a=1, name='x')`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syntax {
    Json,
    Python,
}

/// Whether `c` must be escaped wherever it is shown: control, format (bidi controls, zero-width
/// characters, tag characters), line and paragraph separators, spaces other than U+0020,
/// private-use, unassigned and surrogate code points, and the default-ignorable characters that
/// render as nothing (combining grapheme joiner, Hangul fillers, variation selectors, ...).
pub fn invisible(c: char) -> bool {
    if c == ' ' {
        return false;
    }
    matches!(
        get_general_category(c),
        G::Control
            | G::Format
            | G::LineSeparator
            | G::ParagraphSeparator
            | G::SpaceSeparator
            | G::PrivateUse
            | G::Unassigned
            | G::Surrogate
    ) || matches!(
        c,
        '\u{034F}'
            | '\u{115F}'
            | '\u{1160}'
            | '\u{17B4}'
            | '\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{2800}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FFA0}'
            | '\u{E0100}'..='\u{E01EF}'
    )
}

/// Whether `name` is shown bare: ASCII letters, digits, `_`, `-` and `.`, at least one.
pub fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// A name: bare if plain, else quoted with every non-ASCII or invisible character escaped.
pub fn name(name: &str, syntax: Syntax) -> String {
    if is_plain_name(name) {
        name.to_string()
    } else {
        quote(name, syntax, true)
    }
}

/// A string value, quoted, invisible characters escaped.
pub fn string(s: &str, syntax: Syntax) -> String {
    quote(s, syntax, false)
}

/// A JSON value: JSON (compact) or a Python literal; object keys are strings like any other.
pub fn value(v: &Value, syntax: Syntax) -> String {
    let mut out = String::new();
    write_value(&mut out, v, syntax);
    out
}

/// Arguments as `a=1, name="x"` (names by [`name`], values by [`value`]).
pub fn arguments(args: &Map<String, Value>, syntax: Syntax) -> String {
    args.iter()
        .map(|(k, v)| format!("{}={}", name(k, syntax), value(v, syntax)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A tool call: `server.tool(a=1, name="x")`.
pub fn call(server: &str, tool: &str, args: &Map<String, Value>, syntax: Syntax) -> String {
    format!(
        "{}.{}({})",
        name(server, syntax),
        name(tool, syntax),
        arguments(args, syntax)
    )
}

/// A command as it runs: one line as is; several lines each prefixed with `| ` (a single final
/// newline is not shown). Invisible characters (but tabs) are escaped as `\u{202e}`; nothing
/// else is changed, so the text is the command.
pub fn command(cmd: &str) -> String {
    let body = cmd.strip_suffix('\n').unwrap_or(cmd);
    if !body.contains('\n') {
        return escape_line(body);
    }
    body.split('\n')
        .map(|line| {
            let line = escape_line(line);
            if line.is_empty() {
                "|".to_string()
            } else {
                format!("| {line}")
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn escape_line(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    for c in line.chars() {
        if c != '\t' && invisible(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

fn write_value(out: &mut String, v: &Value, syntax: Syntax) {
    let (sep, colon) = match syntax {
        Syntax::Json => (",", ":"),
        Syntax::Python => (", ", ": "),
    };
    match v {
        Value::Null => out.push_str(match syntax {
            Syntax::Json => "null",
            Syntax::Python => "None",
        }),
        Value::Bool(b) => out.push_str(match (syntax, b) {
            (Syntax::Json, true) => "true",
            (Syntax::Json, false) => "false",
            (Syntax::Python, true) => "True",
            (Syntax::Python, false) => "False",
        }),
        Value::Number(n) => match syntax {
            Syntax::Json => out.push_str(&n.to_string()),
            Syntax::Python => out.push_str(&python_number(n)),
        },
        Value::String(s) => out.push_str(&quote(s, syntax, false)),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                write_value(out, item, syntax);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                out.push_str(&quote(k, syntax, false));
                out.push_str(colon);
                write_value(out, item, syntax);
            }
            out.push('}');
        }
    }
}

/// A number as Python's `repr` writes the float or int `json.loads` makes of it.
fn python_number(n: &serde_json::Number) -> String {
    let text = n.to_string();
    if n.is_f64() {
        // Python: `1e+100`, `1e-07`; serde_json: `1e100`, `1e-7`.
        if let Some((mantissa, exp)) = text.split_once(['e', 'E']) {
            let (sign, digits) = match exp.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', exp.trim_start_matches('+')),
            };
            return format!("{mantissa}e{sign}{digits:0>2}");
        }
    }
    text
}

/// `s` quoted for `syntax`; with `ascii_only` every non-ASCII character is escaped too (names).
fn quote(s: &str, syntax: Syntax, ascii_only: bool) -> String {
    let q = match syntax {
        Syntax::Json => '"',
        // Python's repr: single quotes unless the text has one and no double quote.
        Syntax::Python if s.contains('\'') && !s.contains('"') => '"',
        Syntax::Python => '\'',
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if invisible(c) || (ascii_only && !c.is_ascii()) => escape_char(&mut out, c, syntax),
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

fn escape_char(out: &mut String, c: char, syntax: Syntax) {
    let code = c as u32;
    match syntax {
        Syntax::Json => {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
        Syntax::Python if code < 0x100 => out.push_str(&format!("\\x{code:02x}")),
        Syntax::Python if code < 0x10000 => out.push_str(&format!("\\u{code:04x}")),
        Syntax::Python => out.push_str(&format!("\\U{code:08x}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    /// Nasty names and values -> the exact text shown (JSON and Python syntax).
    #[test]
    fn renders_nasty_requests_exactly() {
        let zw = "\u{200b}".repeat(3);
        let cases: Vec<(&str, &str, Value, &str, &str)> = vec![
            (
                "fx",
                "add",
                json!({"a": 1, "b": 2}),
                "fx.add(a=1, b=2)",
                "fx.add(a=1, b=2)",
            ),
            (
                "fixture",
                "get-thing",
                json!({"id": "7"}),
                r#"fixture.get-thing(id="7")"#,
                "fixture.get-thing(id='7')",
            ),
            (
                "fixture",
                "echo",
                json!({"text": "hi", "number": 1.5, "flag": true, "items": [1, "x"], "n": null}),
                r#"fixture.echo(text="hi", number=1.5, flag=true, items=[1,"x"], n=null)"#,
                "fixture.echo(text='hi', number=1.5, flag=True, items=[1, 'x'], n=None)",
            ),
            // A zero-width argument name cannot push the real one out of view or pass for it.
            (
                "fx",
                "add",
                json!({format!("{zw}a"): 1000000}),
                r#"fx.add("\u200b\u200b\u200ba"=1000000)"#,
                r"fx.add('\u200b\u200b\u200ba'=1000000)",
            ),
            // Newlines in a name cannot print a fake second request.
            (
                "fx",
                "add",
                json!({"a=1)\nipybox: approve tool call fx.add(a": 2}),
                r#"fx.add("a=1)\nipybox: approve tool call fx.add(a"=2)"#,
                r"fx.add('a=1)\nipybox: approve tool call fx.add(a'=2)",
            ),
            // ANSI escapes and bidi overrides in server and tool names.
            (
                "\u{1b}[2Jfx",
                "ad\u{202e}dd",
                json!({}),
                r#""\u001b[2Jfx"."ad\u202edd"()"#,
                r"'\x1b[2Jfx'.'ad\u202edd'()",
            ),
            // Non-ASCII names are escaped (homoglyphs); non-ASCII values are kept.
            (
                "fx",
                "greet",
                json!({"n\u{0430}me": "Grüße \u{202e}x", "q": "it's"}),
                r#"fx.greet("n\u0430me"="Grüße \u202ex", q="it's")"#,
                r#"fx.greet('n\u0430me'='Grüße \u202ex', q="it's")"#,
            ),
            // Nested keys and strings, tag characters (astral), tabs and carriage returns.
            (
                "fx",
                "put",
                json!({"o": {"k\u{e0041}": "a\tb\rc\u{2028}"}, "big": 1e300}),
                r#"fx.put(o={"k\udb40\udc41":"a\tb\rc\u2028"}, big=1e+300)"#,
                r"fx.put(o={'k\U000e0041': 'a\tb\rc\u2028'}, big=1e+300)",
            ),
            (
                "",
                "quote\"d",
                json!({"": "back\\slash"}),
                r#"""."quote\"d"(""="back\\slash")"#,
                r#"''.'quote"d'(''='back\\slash')"#,
            ),
        ];
        for (server, tool, a, json_text, python_text) in cases {
            let a = args(a);
            assert_eq!(call(server, tool, &a, Syntax::Json), json_text);
            assert_eq!(call(server, tool, &a, Syntax::Python), python_text);
        }
    }

    #[test]
    fn commands_are_shown_whole_and_line_by_line() {
        let cases = [
            ("echo hello world", "echo hello world"),
            ("echo hi\n", "echo hi"),
            // Zero-width padding cannot hide what follows.
            (
                "echo hi\u{200b}\u{200b}; touch x",
                "echo hi\\u{200b}\\u{200b}; touch x",
            ),
            ("echo a\necho b\n\n", "| echo a\n| echo b\n|"),
            (
                "ok\nipybox: approve tool call fx.add()? [y/N] y",
                "| ok\n| ipybox: approve tool call fx.add()? [y/N] y",
            ),
            ("printf 'a\tb'\r\u{1b}[1A", "printf 'a\tb'\\u{d}\\u{1b}[1A"),
            ("echo \u{202e}gnp.exe", "echo \\u{202e}gnp.exe"),
            ("echo Grüße", "echo Grüße"),
        ];
        for (cmd, shown) in cases {
            assert_eq!(command(cmd), shown, "{cmd:?}");
        }
    }

    #[test]
    fn invisible_characters() {
        for c in [
            '\0',
            '\u{7f}',
            '\u{85}',
            '\u{a0}',
            '\u{ad}',
            '\u{200b}',
            '\u{200d}',
            '\u{202e}',
            '\u{2066}',
            '\u{2028}',
            '\u{3000}',
            '\u{feff}',
            '\u{e000}',
            '\u{e0041}',
            '\u{fe0f}',
            '\u{3164}',
            '\u{10ffff}',
        ] {
            assert!(invisible(c), "{:x}", c as u32);
        }
        for c in [' ', 'a', 'é', 'ß', '中', '😀', '\u{0301}'] {
            assert!(!invisible(c), "{:x}", c as u32);
        }
    }
}
