//! Whether a JSON Schema `pattern` can be handed to pydantic as is.
//!
//! JSON Schema patterns are ECMA-262 regexes; pydantic compiles them with Rust's `regex` crate
//! (and Python's `re` where it falls back). A pattern outside the conservative subset accepted
//! here is dropped from the generated model rather than risk a module that fails to import.
//! This is a syntax check only; it does not compile anything.

/// True if `p` only uses syntax that Rust `regex` and Python `re` both accept with the same
/// meaning: no look-around, back-references, named groups, inline flags, possessive
/// quantifiers, nested classes or class set operations, and only common escapes.
pub(super) fn is_portable(p: &str) -> bool {
    let chars: Vec<char> = p.chars().collect();
    let mut i = 0;
    let mut depth = 0i32;
    let mut in_class = false;
    let mut prev_quantifier = false;
    while i < chars.len() {
        let c = chars[i];
        let mut quantifier = false;
        match c {
            '\\' => {
                let Some(&n) = chars.get(i + 1) else {
                    return false;
                };
                match n {
                    'd' | 'D' | 'w' | 'W' | 's' | 'S' | 'n' | 'r' | 't' | 'f' | 'v' => i += 1,
                    'b' | 'B' if !in_class => i += 1,
                    'x' => {
                        if !(chars.len() > i + 3
                            && chars[i + 2..i + 4].iter().all(|c| c.is_ascii_hexdigit()))
                        {
                            return false;
                        }
                        i += 3;
                    }
                    'u' => {
                        if !(chars.len() > i + 5
                            && chars[i + 2..i + 6].iter().all(|c| c.is_ascii_hexdigit()))
                        {
                            return false;
                        }
                        i += 5;
                    }
                    '<' | '>' => return false,
                    n if n.is_ascii_punctuation() || n == ' ' => i += 1,
                    _ => return false,
                }
            }
            '[' if in_class => return false,
            '[' => {
                in_class = true;
                if chars.get(i + 1) == Some(&'^') {
                    i += 1;
                }
                if chars.get(i + 1) == Some(&']') {
                    i += 1; // a leading `]` is a literal in both
                }
            }
            ']' if in_class => in_class = false,
            '&' | '-' | '~' | '|' if in_class && chars.get(i + 1) == Some(&c) => return false,
            _ if in_class => {}
            '(' => {
                if chars.get(i + 1) == Some(&'?') {
                    if chars.get(i + 2) != Some(&':') {
                        return false;
                    }
                    i += 2;
                }
                depth += 1;
            }
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            '*' | '+' | '?' => {
                if prev_quantifier && c == '+' {
                    return false;
                }
                quantifier = c != '?' || !prev_quantifier;
            }
            '{' => {
                // Only a well-formed counted repetition `{n}`, `{n,}`, `{n,m}`.
                let rest: String = chars[i + 1..].iter().take_while(|&&c| c != '}').collect();
                let ok = i + 1 + rest.len() < chars.len() && {
                    let mut parts = rest.splitn(2, ',');
                    let a = parts.next().unwrap_or("");
                    let b = parts.next();
                    !a.is_empty()
                        && a.chars().all(|c| c.is_ascii_digit())
                        && b.is_none_or(|b| b.chars().all(|c| c.is_ascii_digit()))
                };
                if !ok {
                    return false;
                }
                i += rest.chars().count() + 1;
                quantifier = true;
            }
            '}' => return false,
            _ => {}
        }
        prev_quantifier = quantifier;
        i += 1;
    }
    depth == 0 && !in_class
}

#[cfg(test)]
mod tests {
    use super::is_portable;

    #[test]
    fn portable_patterns() {
        for p in [
            r"^\d{4}-\d{2}-\d{2}to\d{4}-\d{2}-\d{2}$",
            r"^[a-zA-Z0-9_.-]+$",
            r"^(?:a|b)*?$",
            r"^[^]x]\.\/$",
            r"\x41\u0042",
            "",
        ] {
            assert!(is_portable(p), "{p}");
        }
        for p in [
            r"^(?=a)",
            r"(?<name>x)",
            r"(?i)abc",
            r"(a)\1",
            r"\p{L}",
            r"a{",
            r"a{,3}",
            r"[[:alpha:]]",
            r"[a&&b]",
            r"a++",
            r"(a",
            r"a)",
            r"\k<x>",
            r"\cA",
            r"\<",
        ] {
            assert!(!is_portable(p), "{p}");
        }
    }
}
