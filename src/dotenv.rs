//! The command line's workspace environment: `<workspace>/.env` parsed leniently (unquoted
//! values with spaces, `export`, comments), merged under the process environment, and split into
//! what `${VAR}` in MCP server params may use and what reaches the kernel (`KERNEL_ENV_X` → `X`).
//!
//! Not here: how the library uses those maps (`CodeExecutor::builder().tool_env/kernel_env`).

use std::collections::HashMap;
use std::path::PathBuf;

/// The environments derived from the process and `<workspace>/.env`.
#[derive(Debug, Clone, Default)]
pub(crate) struct WorkspaceEnv {
    /// Everything (process env, plus `.env` entries not already set): used for `${VAR}` in MCP
    /// server params and as the base of stdio MCP servers' minimal environment.
    pub tool_env: HashMap<String, String>,
    /// `KERNEL_ENV_X=v` entries as `X=v`: the only variables the kernel gets beyond its base.
    pub kernel_env: HashMap<String, String>,
}

/// Why the workspace's `.env` could not be read.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot read {path}: {reason}\n  help: fix the line (format: NAME=value, # comments) or remove the file"
)]
pub(crate) struct DotenvError {
    pub path: PathBuf,
    pub reason: String,
}

impl WorkspaceEnv {
    /// Loads `<workspace>/.env` if present; variables already in `process_env` win.
    pub(crate) fn load(
        workspace: &std::path::Path,
        process_env: HashMap<String, String>,
    ) -> Result<Self, DotenvError> {
        let path = workspace.join(".env");
        let mut tool_env = process_env;
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                for (k, v) in parse_dotenv(&text).map_err(|reason| DotenvError {
                    path: path.clone(),
                    reason,
                })? {
                    ipybox::redact::register(&k, &v);
                    tool_env.entry(k).or_insert(v);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(DotenvError {
                    path,
                    reason: e.to_string(),
                });
            }
        }
        let kernel_env = tool_env
            .iter()
            .filter_map(|(k, v)| {
                let name = k.strip_prefix("KERNEL_ENV_").filter(|n| !n.is_empty())?;
                if ipybox::redact::is_secret_name(name) {
                    ipybox::redact::register(k, v);
                }
                Some((name.to_string(), v.clone()))
            })
            .collect();
        Ok(Self {
            tool_env,
            kernel_env,
        })
    }
}

/// Parses `.env` text: `NAME=value` lines, optional `export `, `#` comment lines, values in
/// single quotes (literal), double quotes (`\n`, `\"`, `\\` escapes) or unquoted (trimmed, a
/// ` #` starts a comment). No interpolation: `${...}` in a value is kept as written.
pub(crate) fn parse_dotenv(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line
            .strip_prefix("export ")
            .map(str::trim_start)
            .unwrap_or(line);
        let Some((name, value)) = line.split_once('=') else {
            return Err(format!("line {}: expected NAME=value", n + 1));
        };
        let name = name.trim();
        if name.is_empty()
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            || name.starts_with(|c: char| c.is_ascii_digit())
        {
            return Err(format!(
                "line {}: `{name}` is not a valid variable name",
                n + 1
            ));
        }
        let value = value.trim();
        let value = if let Some(rest) = value.strip_prefix('\'') {
            let end = rest
                .find('\'')
                .ok_or_else(|| format!("line {}: unterminated single quote", n + 1))?;
            rest[..end].to_string()
        } else if let Some(rest) = value.strip_prefix('"') {
            let mut v = String::new();
            let mut chars = rest.chars();
            loop {
                match chars.next() {
                    None => return Err(format!("line {}: unterminated double quote", n + 1)),
                    Some('"') => break,
                    Some('\\') => match chars.next() {
                        Some('n') => v.push('\n'),
                        Some(c) => v.push(c),
                        None => return Err(format!("line {}: unterminated double quote", n + 1)),
                    },
                    Some(c) => v.push(c),
                }
            }
            v
        } else {
            value
                .split(" #")
                .next()
                .unwrap_or("")
                .trim_end()
                .to_string()
        };
        out.push((name.to_string(), value));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::parse_dotenv;

    #[test]
    fn parses_dotenv_leniently() {
        let text =
            "# c\nA=plain value # note\nexport B='lit ${X} \\n'\nC=\"q \\\"x\\\" \\n end\"\n\nD=\n";
        assert_eq!(
            parse_dotenv(text).unwrap(),
            vec![
                ("A".to_string(), "plain value".to_string()),
                ("B".to_string(), "lit ${X} \\n".to_string()),
                ("C".to_string(), "q \"x\" \n end".to_string()),
                ("D".to_string(), String::new()),
            ]
        );
        assert_eq!(
            parse_dotenv("NOEQUALS").unwrap_err(),
            "line 1: expected NAME=value"
        );
        assert_eq!(
            parse_dotenv("X='open").unwrap_err(),
            "line 1: unterminated single quote"
        );
    }
}
