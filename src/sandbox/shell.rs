//! POSIX shell quoting: one word ([`shell_quote`]) and a whole argv ([`shell_join`]), for the
//! command line srt runs ([`super::wrap`]) and the environment file it sources ([`super::env`]).
//! A leaf: it uses nothing else of the sandbox.

/// Quotes one word for a POSIX shell.
pub(crate) fn shell_quote(word: &str) -> String {
    if !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b))
    {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Joins an argv into one shell command line.
pub(crate) fn shell_join(argv: &[String]) -> String {
    argv.iter()
        .map(|w| shell_quote(w))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_round_trips_through_sh() {
        let argv: Vec<String> = [
            "python",
            "-c",
            "print('a b')\nx = \"$HOME\"",
            "",
            "plain-1.0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let out = crate::child_process::host_command_blocking("sh")
            .arg("-c")
            .arg(format!(
                "for a in {}; do printf '<%s>' \"$a\"; done",
                shell_join(&argv)
            ))
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            "<python><-c><print('a b')\nx = \"$HOME\"><><plain-1.0>"
        );
    }
}
