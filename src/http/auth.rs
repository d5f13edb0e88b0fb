//! Bearer tokens of `ipybox serve --http`: where they come from (`--token`, `IPYBOX_TOKEN`,
//! `--token-file` with one token per line), and checking a request's `Authorization: Bearer`
//! header against them in constant time (SHA-256 of both sides, every configured token
//! compared, no early exit). A request's credential becomes its [`Caller`]: sessions, tasks and
//! parked approvals belong to it.
//!
//! Tokens are never logged, never echoed in a response and never written anywhere; only their
//! digests are kept after start-up.
//!
//! Not here: Origin/Host validation and body limits (rmcp's Streamable HTTP service does those).

use std::path::Path;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::super::mcp_server::caller::Caller;

/// The shortest token accepted (a token is the only thing between the network and code
/// execution).
pub(crate) const MIN_TOKEN_LEN: usize = 16;

/// The configured tokens, as digests.
#[derive(Clone, Default)]
pub(crate) struct Tokens {
    digests: Vec<[u8; 32]>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} configured)", self.digests.len())
    }
}

/// Why a token configuration is refused (the text names the source, never the token).
#[derive(Debug, thiserror::Error)]
pub(crate) enum TokenError {
    #[error("cannot read the token file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "a bearer token from {from} is shorter than {MIN_TOKEN_LEN} characters\n  help: use a long random token, e.g. `openssl rand -hex 32`"
    )]
    TooShort { from: String },
    #[error(
        "a bearer token from {from} contains whitespace or control characters\n  help: tokens are sent as `Authorization: Bearer TOKEN`: use letters, digits and punctuation only"
    )]
    BadCharacters { from: String },
}

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

impl Tokens {
    /// Collects tokens from the command line, the environment and token files.
    pub(crate) fn load(
        flags: &[String],
        env: Option<&str>,
        files: &[std::path::PathBuf],
    ) -> Result<Self, TokenError> {
        let mut tokens = Self::default();
        for token in flags {
            tokens.add(token, "--token")?;
        }
        if let Some(token) = env.filter(|t| !t.is_empty()) {
            tokens.add(token, "IPYBOX_TOKEN")?;
        }
        for file in files {
            tokens.add_file(file)?;
        }
        Ok(tokens)
    }

    fn add(&mut self, token: &str, from: &str) -> Result<(), TokenError> {
        if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(TokenError::BadCharacters { from: from.into() });
        }
        if token.len() < MIN_TOKEN_LEN {
            return Err(TokenError::TooShort { from: from.into() });
        }
        self.digests.push(digest(token.as_bytes()));
        // Never in a notebook or a log line.
        ipybox::redact::register("IPYBOX_TOKEN", token);
        Ok(())
    }

    fn add_file(&mut self, path: &Path) -> Result<(), TokenError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
            path: path.display().to_string(),
            source,
        })?;
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            self.add(line, &format!("{} line {}", path.display(), i + 1))?;
        }
        Ok(())
    }

    /// Whether any token is configured.
    pub(crate) fn any(&self) -> bool {
        !self.digests.is_empty()
    }

    /// How many different tokens are configured (each is a credential of its own).
    pub(crate) fn count(&self) -> usize {
        let mut distinct = self.digests.clone();
        distinct.sort_unstable();
        distinct.dedup();
        distinct.len()
    }

    /// The caller of a request with this `Authorization` header value, or `None` if it carries
    /// no configured token. Without configured tokens every request is [`Caller::Local`].
    pub(crate) fn check(&self, authorization: Option<&[u8]>) -> Option<Caller> {
        if self.digests.is_empty() {
            return Some(Caller::Local);
        }
        let value = authorization?;
        let token = strip_bearer(value)?;
        let presented = digest(token);
        let mut matched = subtle::Choice::from(0);
        for known in &self.digests {
            matched |= known.ct_eq(&presented);
        }
        bool::from(matched).then_some(Caller::Token(presented))
    }
}

/// The token of `Bearer TOKEN` (scheme case-insensitive).
fn strip_bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    (scheme.eq_ignore_ascii_case(b"bearer ") && !rest.is_empty()).then_some(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_every_source_and_never_shows_a_token() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens");
        std::fs::write(&file, "# team tokens\n\nfile-token-0123456789\n").unwrap();
        let tokens = Tokens::load(
            &["flag-token-0123456789".into()],
            Some("env-token-0123456789"),
            &[file],
        )
        .unwrap();
        for token in [
            "flag-token-0123456789",
            "env-token-0123456789",
            "file-token-0123456789",
        ] {
            let header = format!("Bearer {token}");
            assert_eq!(
                tokens.check(Some(header.as_bytes())),
                Some(Caller::Token(digest(token.as_bytes())))
            );
        }
        assert_eq!(
            tokens.check(Some(b"bearer flag-token-0123456789")),
            Some(Caller::Token(digest(b"flag-token-0123456789")))
        );
        for bad in [
            &b"Bearer wrong-token-0123456789"[..],
            b"Basic flag-token-0123456789",
            b"Bearer ",
            b"flag-token-0123456789",
            b"",
        ] {
            assert_eq!(tokens.check(Some(bad)), None);
        }
        assert_eq!(tokens.check(None), None);
        assert_eq!(format!("{tokens:?}"), "Tokens(3 configured)");
        assert_eq!(Tokens::default().check(None), Some(Caller::Local));
    }

    #[test]
    fn weak_tokens_are_refused_without_showing_them() {
        let err = Tokens::load(&["short".into()], None, &[])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("--token") && !err.contains("short "), "{err}");
        let err = Tokens::load(&[], Some("has space in the token"), &[])
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("IPYBOX_TOKEN") && !err.contains("has space"),
            "{err}"
        );
    }
}
