//! Text that came from a kernel or a kernel factory template (hostile code under `--sandbox`, on
//! a gateway, or whenever a session's code is not the user's own), made safe to put in a log
//! record: every control character (newlines included), the Unicode line and paragraph
//! separators and the bidirectional overrides are shown escaped (`\n`, `\u{1b}`, `\u{202e}`), so
//! one log record stays one line and such text can neither forge a record nor drive a terminal.
//!
//! Library log sites escape such strings with [`escaped`] (an SDK application's subscriber does
//! not know which fields are hostile); the `ipybox` binary also escapes every record it writes
//! the same way, as a last line of defence. Not here: what a log record may carry at all (no
//! code, output or handle: the binary's logging setup), error messages for users (those keep
//! their lines).

use std::borrow::Cow;

/// Whether `c` is shown escaped in a log record.
pub fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}'
        )
}

/// `text` with every character of [`needs_escape`] escaped (`\n`, `\r`, `\t`, else
/// `\u{…}`); borrowed when there is none.
pub fn escaped(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::escaped;

    #[test]
    fn one_line_whatever_the_text() {
        assert_eq!(escaped("plain text"), "plain text");
        assert_eq!(
            escaped("a\nERROR forged\r\x1b[31mred\u{202e}txt\u{2028}end\t."),
            "a\\nERROR forged\\r\\u{1b}[31mred\\u{202e}txt\\u{2028}end\\t."
        );
        assert!(!escaped("\u{85}\u{7f}\0").chars().any(char::is_control));
    }
}
