//! Who makes a request ([`Caller`]): the credential it carried, as the sessions, handles, tasks
//! and parked rounds that belong to it are bound to. A leaf: it knows nothing of sessions.

/// Who makes a request: the credential it carried. Over stdio (and over HTTP on loopback
/// without a token) everyone is [`Caller::Local`]; over HTTP with tokens, a digest of the
/// bearer token (never the token itself).
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) enum Caller {
    Local,
    /// SHA-256 of the bearer token.
    Token([u8; 32]),
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Caller::Local => f.write_str("Caller::Local"),
            Caller::Token(_) => f.write_str("Caller::Token(..)"),
        }
    }
}

impl Caller {
    /// The bytes that bind a handle to this credential.
    pub(crate) fn binding(&self) -> &[u8] {
        match self {
            Caller::Local => b"local",
            Caller::Token(digest) => digest,
        }
    }
}
